//! Stage `{name}`: one call, as one or more attempts, each a request and its body under
//! what is left of the deadline, with the budget propagated and the trace context
//! injected; then the call's answer.
//!
//! A call is its first attempt, perhaps a hedge beside it (when a plugin times one),
//! perhaps a retry after it (a refused connection; a 503 of a request safe to send
//! twice). Every extra attempt passes three checks, in order, and is counted when it
//! does not:
//!
//! 1. the deadline: no COMMIT is on the wire, and what is left covers what nine recent
//!    attempts in ten took (at least 20 ms);
//! 2. a slot, for a hedge (a retry keeps the slot of the attempt it repeats);
//! 3. the plugins (the retry budget's token).
//!
//! Each attempt is timed on its own and told to the plugins; one dropped unfinished
//! (its caller went away, or its hedge won) is told as cancelled, and as cut.

use std::pin::pin;
use std::time::Duration;

use http::header::HeaderName;
use http::{HeaderMap, Method, StatusCode};
use tokio::time::Instant;
use tracing::Instrument;

use super::request::{CallRequest, Reply};
use super::wire::server_total;
use super::{
    Attempt, AttemptEnd, AttemptKind, AttemptOutcome, BudgetedClient, CallError, CallErrorKind,
    Event, Slot,
};
use crate::deadline::{Deadline, DeadlineExceeded};
use crate::header::REQUEST_TIMEOUT_HEADER;
use crate::mode::{DEADLINE_MODE_HEADER, DeadlineMode, OBSERVE};

/// The least budget worth any extra attempt, whatever the plugins know.
const MIN_RETRY_BUDGET: Duration = Duration::from_millis(20);

/// The headers the client sets itself; a caller's values for them are dropped, so no
/// caller can send more budget than is left, a mode that is not this call's, or a
/// trace context that is not this call's.
const OWNED_HEADERS: [HeaderName; 4] = [
    REQUEST_TIMEOUT_HEADER,
    DEADLINE_MODE_HEADER,
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
];

/// What one attempt gave: reqwest's answer (any status) or its failure, or the
/// deadline.
type Outcome = Result<Result<Reply, reqwest::Error>, DeadlineExceeded>;

/// An attempt that ran and that the call did not end with: its kind, and whether it
/// was cut.
#[derive(Clone, Copy)]
struct Ran {
    kind: AttemptKind,
    cut: bool,
}

/// One attempt that came back, with the slot it held (a retry goes on it).
struct Tried {
    outcome: Outcome,
    slot: Slot,
    /// Cut by our deadline, or answered 504.
    cut: bool,
}

impl Tried {
    /// An answer the call can end with: any status but a 5xx (a 404 is an answer too),
    /// not a failure to reach the downstream, not the deadline.
    fn is_good(&self) -> bool {
        matches!(&self.outcome, Ok(Ok(reply)) if !reply.status.is_server_error())
    }
}

impl BudgetedClient {
    /// The call in a client span named after the method and the downstream
    /// (`POST inventory`), carrying the budget and what is left of it.
    pub(super) async fn send_request(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        slot: Slot,
    ) -> Result<Reply, CallError> {
        let method = request.method.as_str();
        let span = tracing::info_span!(
            "http.client",
            otel.name = %format_args!("{method} {}", self.config.name),
            otel.kind = "client",
            http.request.method = method,
            url.full = %format_args!("{}{}", self.config.base_url, request.path),
            deadline.budget_ms = deadline.budget().as_millis() as u64,
            deadline.remaining_ms = deadline.remaining().as_millis() as u64,
            http.response.status_code = tracing::field::Empty,
        );
        self.send_in(deadline, request, slot, &span)
            .instrument(span.clone())
            .await
    }

    async fn send_in(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        slot: Slot,
        span: &tracing::Span,
    ) -> Result<Reply, CallError> {
        let stage = self.config.name.call();
        let mode = deadline.mode();
        let spent = self.is_spent(deadline);
        if spent && mode.enforces() {
            // Nothing is sent, so there is nothing to learn from either.
            return Err(self.error(CallErrorKind::Deadline(deadline.exceeded(stage))));
        }
        let mut headers = request.headers.clone();
        for owned in &OWNED_HEADERS {
            headers.remove(owned);
        }
        crate::trace::inject(span, &mut headers);
        self.emit(Event::Call);
        let first = self.try_once(deadline, request, headers.clone(), slot);
        // The attempts that ran and that the call did not end with.
        let mut ran = Vec::with_capacity(2);
        let (mut tried, mut kind) = match self.hedge_delay(deadline, request) {
            Some(delay) => {
                self.hedged(deadline, request, &headers, first, delay, &mut ran)
                    .await
            }
            None => (first.await, AttemptKind::First),
        };
        // A refused connection sent nothing, so a retry is safe for any method (a POST
        // included: the downstream never saw it); a 503 says the downstream refused the
        // request before doing any work, which is safe to repeat for a request that may
        // be sent twice. Nothing else is retried, a 504 least of all: the shared
        // deadline has run out there.
        let retryable = match &tried.outcome {
            Ok(Err(err)) => err.is_connect(),
            Ok(Ok(reply)) => {
                reply.status == StatusCode::SERVICE_UNAVAILABLE && request.repeatable()
            }
            Err(_) => false,
        };
        if retryable && mode.enforces() {
            match self
                .deadline_allows_extra(deadline)
                .and_then(|()| self.plugins_allow_extra())
            {
                Ok(()) => {
                    self.emit(Event::Retry);
                    ran.push(Ran {
                        kind,
                        cut: tried.cut,
                    });
                    tried = self.try_once(deadline, request, headers, tried.slot).await;
                    kind = AttemptKind::Retry;
                }
                Err(refused) => self.count(AttemptKind::Retry, refused),
            }
        }
        // The attempts the call did not end with lost (or were cut); the last won,
        // unless it was cut.
        for loser in &ran {
            let outcome = match loser.cut {
                true => AttemptOutcome::Cut,
                false => AttemptOutcome::Lost,
            };
            self.count(loser.kind, outcome);
        }
        let outcome = match tried.cut {
            true => AttemptOutcome::Cut,
            false => AttemptOutcome::Won,
        };
        self.count(kind, outcome);
        if let Ok(Ok(answer)) = &tried.outcome {
            span.record("http.response.status_code", answer.status.as_u16());
        }
        if mode == DeadlineMode::Observe && (spent || deadline.is_expired()) {
            deadline.would_refuse(stage, "deadline");
        }
        match tried.outcome {
            Err(exceeded) => Err(self.error(CallErrorKind::Deadline(exceeded))),
            Ok(Ok(answer)) => CallError::check(self.config.name, answer, deadline),
            Ok(Err(err)) => Err(self.error(CallErrorKind::Unreachable).caused_by(err)),
        }
    }

    /// The first attempt, and a hedge beside it if it has not answered after `delay`
    /// and the checks allow one; the first good answer wins and the other attempt is
    /// dropped (pushed onto `ran`). Returns the answer and the kind of its attempt.
    async fn hedged(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        headers: &HeaderMap,
        first: impl Future<Output = Tried>,
        delay: Duration,
        ran: &mut Vec<Ran>,
    ) -> (Tried, AttemptKind) {
        let mut first = pin!(first);
        tokio::select! {
            biased;
            tried = &mut first => return (tried, AttemptKind::First),
            () = tokio::time::sleep(delay) => {}
        }
        let slot = self.deadline_allows_extra(deadline).and_then(|()| {
            let slot = self.bulkhead.try_acquire().ok_or(AttemptOutcome::NoSlot)?;
            self.plugins_allow_extra().map(|()| slot)
        });
        let slot = match slot {
            Ok(slot) => slot,
            Err(refused) => {
                self.count(AttemptKind::Hedge, refused);
                return (first.await, AttemptKind::First);
            }
        };
        let mut hedge = pin!(self.try_once(deadline, request, headers.clone(), slot));
        let (first_kind, hedge_kind) = (AttemptKind::First, AttemptKind::Hedge);
        let (winner, loser) = tokio::select! {
            tried = &mut first => {
                if tried.is_good() {
                    // The hedge is dropped unfinished: it lost, it was not cut.
                    ((tried, first_kind), Ran { kind: hedge_kind, cut: false })
                } else {
                    // The first failed: the hedge's answer is the call's, whatever it is.
                    let loser = Ran { kind: first_kind, cut: tried.cut };
                    ((hedge.await, hedge_kind), loser)
                }
            }
            tried = &mut hedge => {
                if tried.is_good() {
                    ((tried, hedge_kind), Ran { kind: first_kind, cut: false })
                } else {
                    let loser = Ran { kind: hedge_kind, cut: tried.cut };
                    ((first.await, first_kind), loser)
                }
            }
        };
        ran.push(loser);
        winner
    }

    /// When the first attempt of this call may be hedged: a plugin times hedges, the
    /// request is safe to send twice and not a health check, and the mode is propagate
    /// (observe sends what code without the technique sends).
    fn hedge_delay(&self, deadline: &Deadline, request: &CallRequest<'_>) -> Option<Duration> {
        let hedgeable = request.repeatable() && request.admission && deadline.mode().enforces();
        hedgeable
            .then(|| self.plugins.iter().find_map(|p| p.hedge_after()))
            .flatten()
    }

    /// The deadline's check of an extra attempt: no COMMIT on the wire, and, unless a
    /// plugin switched the rule off, what is left (less what is kept back) covers what
    /// nine recent attempts in ten took. An attempt with less would too often be cut at
    /// the deadline: the work it asks of the downstream would be thrown away.
    fn deadline_allows_extra(&self, deadline: &Deadline) -> Result<(), AttemptOutcome> {
        let rule = self.plugins.iter().all(|p| p.deadline_rule());
        let likely = self.plugins.iter().find_map(|p| p.likely_attempt());
        let likely = likely.unwrap_or_default().max(MIN_RETRY_BUDGET);
        let left = deadline.remaining().saturating_sub(self.keep_back());
        if deadline.log().past_no_return() || (rule && left < likely) {
            return Err(AttemptOutcome::RefusedDeadline);
        }
        Ok(())
    }

    /// The plugins' check, asked last so that one refused for another reason spends
    /// nothing.
    fn plugins_allow_extra(&self) -> Result<(), AttemptOutcome> {
        match self.plugins.iter().all(|p| p.allow_extra()) {
            true => Ok(()),
            false => Err(AttemptOutcome::RefusedBudget),
        }
    }

    fn count(&self, kind: AttemptKind, outcome: AttemptOutcome) {
        self.emit(Event::Counted(kind, outcome));
    }

    /// One attempt on `slot`, timed and told.
    async fn try_once(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        headers: HeaderMap,
        slot: Slot,
    ) -> Tried {
        let started = Instant::now();
        let unfinished = Unfinished {
            client: self,
            learns: request.admission,
            started,
        };
        let outcome = self.attempt(deadline, request, headers).await;
        std::mem::forget(unfinished);
        let cut = self.learn(started, &outcome, request.admission);
        Tried { outcome, slot, cut }
    }

    /// Tells the plugins an attempt came back (censored when cut at our deadline, or
    /// when the downstream ran out of the budget we gave it: it would have taken at
    /// least this long), and learns the wire's share of it. Returns whether it was cut.
    fn learn(&self, started: Instant, outcome: &Outcome, learns: bool) -> bool {
        let took = started.elapsed();
        let (end, censored) = match outcome {
            Err(_) => (AttemptEnd::Timeout, true),
            Ok(Ok(answer)) => (
                AttemptEnd::Status(answer.status),
                answer.status == StatusCode::GATEWAY_TIMEOUT,
            ),
            Ok(Err(err)) if err.is_timeout() => (AttemptEnd::Timeout, true),
            Ok(Err(_)) => (AttemptEnd::Error, false),
        };
        if let Ok(Ok(answer)) = outcome
            && let Some(server) = server_total(&answer.headers)
        {
            self.wire.record(took, server);
        }
        self.emit(Event::Attempt(Attempt {
            started,
            took,
            end,
            censored,
            learns,
        }));
        censored
    }

    /// One request, bounded as the mode says.
    async fn attempt(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        mut headers: HeaderMap,
    ) -> Outcome {
        let stage = self.config.name.call();
        let url = format!("{}{}", self.config.base_url, request.path);
        let budget = deadline.outbound_millis(self.keep_back());
        if let Some(ms) = budget {
            headers.insert(REQUEST_TIMEOUT_HEADER, ms.into());
        }
        let timeout = match deadline.mode() {
            // The budget goes downstream (unless spent), but nothing here enforces it,
            // and the marker asks the downstream not to enforce it either.
            DeadlineMode::Observe => {
                headers.insert(DEADLINE_MODE_HEADER, OBSERVE);
                Some(self.config.timeout)
            }
            // No more than what is kept back is left: the budget is spent, no I/O.
            DeadlineMode::Propagate if budget.is_none() => return Err(deadline.exceeded(stage)),
            DeadlineMode::Propagate => None,
        };
        let mut builder = self
            .http
            .request(request.method.clone(), url)
            .headers(headers);
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        let downstream = self.config.name;
        match timeout {
            Some(timeout) => Ok(fetch(builder.timeout(timeout), downstream).await),
            None => deadline.run(stage, fetch(builder, downstream)).await,
        }
    }
}

impl CallRequest<'_> {
    /// Whether the request may be sent twice: `GET` and `HEAD`, or a request that
    /// carries an `Idempotency-Key` or was marked [`idempotent`](Self::idempotent).
    pub(super) fn repeatable(&self) -> bool {
        self.idempotent
            || self.method == Method::GET
            || self.method == Method::HEAD
            || self.headers.contains_key("idempotency-key")
    }
}

/// Sends and reads the whole body: both belong inside the same timeout. The answer is
/// any status here; [`CallError::check`] sorts success from failure.
async fn fetch(
    request: reqwest::RequestBuilder,
    downstream: crate::stage::Downstream,
) -> Result<Reply, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok(Reply {
        status,
        headers,
        body,
        downstream,
    })
}

/// An attempt that has started and is not yet timed. If its future is dropped first
/// (the caller went away; or its hedge won), the guard tells it as cancelled and cut.
/// Without it, the calls of callers who gave up would drop out of every estimate, and
/// a downstream slower than their patience would read as a fast one.
struct Unfinished<'a> {
    client: &'a BudgetedClient,
    learns: bool,
    started: Instant,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        self.client.emit(Event::Attempt(Attempt {
            started: self.started,
            took: self.started.elapsed(),
            end: AttemptEnd::Cancelled,
            censored: true,
            learns: self.learns,
        }));
    }
}
