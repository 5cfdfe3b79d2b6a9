//! Stage `{name}`: one call as attempts, each a request and its body under what is left,
//! the budget sent on: the first, perhaps a hedge beside it (feature `hedging`),
//! perhaps a retry after it (a refused connection; a 503 of a request safe to send
//! twice). Each is timed and told to the plugins. A write is waited for past the
//! deadline, briefly, to learn its outcome (`request.rs`).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, StatusCode};
use tokio::time::{Instant, timeout_at};
use tracing::Instrument;

use super::request::{CallRequest, Reply};
use super::wire::server_total;
use super::{
    Attempt, AttemptKind, AttemptOutcome, BudgetedClient, CallError, CallErrorKind, Event, Slot,
};
use crate::deadline::{Deadline, DeadlineExceeded, OUTCOME_GRACE};
use crate::header::{PREVIOUS_ATTEMPTS_HEADER, REQUEST_TIMEOUT_HEADER};
use crate::mode::{DEADLINE_MODE_HEADER, DeadlineMode, OBSERVE};

#[cfg(feature = "hedging")]
mod hedge;

/// The least budget worth any extra attempt.
const MIN_RETRY_BUDGET: Duration = Duration::from_millis(20);

/// What one attempt gave: an answer (any status) or a failure, or the deadline.
type Outcome = Result<Result<Reply, Failed>, DeadlineExceeded>;

/// Why an attempt has no answer to use.
#[derive(Debug)]
enum Failed {
    /// The transport failed: refused, reset, or (observe) the fixed timeout.
    Http(reqwest::Error),
    /// The body passed `max_body` bytes.
    TooLarge(usize),
    /// A write had no answer by the deadline and the grace after it.
    Unknown,
}

/// One attempt that came back, with the slot it held (a retry goes on it).
struct Tried {
    outcome: Outcome,
    slot: Slot,
    /// Cut by our deadline, or answered 504.
    cut: bool,
}

impl BudgetedClient {
    /// The call in a client span (`POST inventory`).
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
            return Err(self.error(CallErrorKind::Deadline(deadline.exceeded(stage))));
        }
        // The trace context, the same for every attempt (empty without `otel`).
        let mut trace = HeaderMap::new();
        crate::trace::inject(span, &mut trace);
        self.emit(Event::Call);
        let first = self.try_once(deadline, request, &trace, slot, 0);
        // The attempts that ran and that the call did not end with: kind, and cut.
        let mut ran = Vec::with_capacity(2);
        #[cfg(feature = "hedging")]
        let (mut tried, mut kind) = self
            .hedged(deadline, request, &trace, first, &mut ran)
            .await;
        #[cfg(not(feature = "hedging"))]
        let (mut tried, mut kind) = (first.await, AttemptKind::First);
        // A refused connection sent nothing: safe to retry for any method. A 503 says
        // the downstream refused before any work: safe for a request that may go twice.
        let retryable = match &tried.outcome {
            Ok(Err(Failed::Http(err))) => err.is_connect(),
            Ok(Err(_)) => false,
            Ok(Ok(reply)) => {
                reply.status == StatusCode::SERVICE_UNAVAILABLE && request.repeatable()
            }
            Err(_) => false,
        };
        // A caller above that owns retries (`X-Previous-Attempts`) retries for us.
        if retryable && mode.enforces() && deadline.previous_attempts().is_none() {
            match self.extra_allowed(deadline, || Some(())) {
                Ok(()) => {
                    self.emit(Event::Retry);
                    ran.push((kind, tried.cut));
                    tried = self
                        .try_once(deadline, request, &trace, tried.slot, 1)
                        .await;
                    kind = AttemptKind::Retry;
                }
                Err(refused) => self.emit(Event::Counted(AttemptKind::Retry, refused)),
            }
        }
        let outcome = |cut, otherwise| if cut { AttemptOutcome::Cut } else { otherwise };
        for (loser, cut) in ran {
            self.emit(Event::Counted(loser, outcome(cut, AttemptOutcome::Lost)));
        }
        self.emit(Event::Counted(
            kind,
            outcome(tried.cut, AttemptOutcome::Won),
        ));
        if let Ok(Ok(answer)) = &tried.outcome {
            span.record("http.response.status_code", answer.status.as_u16());
        }
        if mode == DeadlineMode::Observe && (spent || deadline.is_expired()) {
            deadline.would_refuse(stage, "deadline");
        }
        let writes = request.writes();
        let result = match tried.outcome {
            Err(exceeded) => Err(self.error(CallErrorKind::Deadline(exceeded))),
            Ok(Ok(answer)) => CallError::check(self.config.name, answer, deadline),
            // Only a refused connection proves that a write was not sent.
            Ok(Err(Failed::Http(err))) if writes && !err.is_connect() => {
                Err(self.error(CallErrorKind::OutcomeUnknown).caused_by(err))
            }
            Ok(Err(Failed::Http(err))) => {
                Err(self.error(CallErrorKind::Unreachable).caused_by(err))
            }
            Ok(Err(Failed::TooLarge(limit))) => Err(self.error(CallErrorKind::TooLarge(limit))),
            Ok(Err(Failed::Unknown)) => Err(self.error(CallErrorKind::OutcomeUnknown)),
        };
        // A write the downstream may have acted on (or a downstream that says it may
        // have): neither this call's error nor, later, this request's answer may say
        // that nothing was written (the ingress sees to the answer).
        let acted = match &result {
            Ok(_) => writes,
            Err(err) => {
                err.kind() == CallErrorKind::OutcomeUnknown
                    || (writes && err.kind().may_have_acted())
            }
        };
        if acted {
            deadline.log().mark_acted();
        }
        match result {
            Err(err) if acted => Err(err.outcome_unknown()),
            result => result,
        }
    }

    /// The checks of an extra attempt, in order: the deadline (no COMMIT on the wire,
    /// and what is left covers what nine attempts in ten take, unless a plugin switched
    /// that rule off), then `slot` (a hedge's: one free at once), then the plugins
    /// (asked last, so that one refused for another reason spends nothing).
    fn extra_allowed<S>(
        &self,
        deadline: &Deadline,
        slot: impl FnOnce() -> Option<S>,
    ) -> Result<S, AttemptOutcome> {
        let rule = self.plugins.iter().all(|p| p.deadline_rule());
        let likely = self.plugins.iter().find_map(|p| p.likely_attempt());
        let likely = likely.unwrap_or_default().max(MIN_RETRY_BUDGET);
        let left = deadline.remaining().saturating_sub(self.keep_back());
        if deadline.log().past_no_return() || (rule && left < likely) {
            return Err(AttemptOutcome::RefusedDeadline);
        }
        let slot = slot().ok_or(AttemptOutcome::NoSlot)?;
        match self.plugins.iter().all(|p| p.allow_extra()) {
            true => Ok(slot),
            false => Err(AttemptOutcome::RefusedBudget),
        }
    }

    /// Attempt `nth` (0 for the first) on `slot`, timed and told.
    async fn try_once(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        trace: &HeaderMap,
        slot: Slot,
        nth: u32,
    ) -> Tried {
        let started = Instant::now();
        let unfinished = Unfinished {
            client: self,
            learns: request.admission,
            started,
        };
        let outcome = self.attempt(deadline, request, trace, nth).await;
        std::mem::forget(unfinished);
        let took = started.elapsed();
        let (status, failure) = match &outcome {
            Ok(Ok(answer)) => (Some(answer.status), ""),
            Ok(Err(Failed::Http(err))) if !err.is_timeout() => (None, "error"),
            Ok(Err(Failed::TooLarge(_))) => (None, "error"),
            _ => (None, "timeout"),
        };
        // Censored when cut at our deadline, or when the downstream ran out of the
        // budget we gave it: it would have taken at least this long.
        let cut = status.is_none_or(|s| s == StatusCode::GATEWAY_TIMEOUT) && failure != "error";
        if let Ok(Ok(answer)) = &outcome
            && let Some(server) = server_total(&answer.headers)
        {
            self.wire.record(took, server);
        }
        let learns = request.admission;
        self.emit(Event::Attempt(Attempt {
            started,
            took,
            status,
            failure,
            censored: cut,
            learns,
        }));
        Tried { outcome, slot, cut }
    }

    /// One request: bounded by the deadline in propagate, by the fixed timeout in
    /// observe (with the marker, so the downstream does not enforce either). It says
    /// which attempt it is, or passes on the count of the caller above that owns them.
    async fn attempt(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        trace: &HeaderMap,
        nth: u32,
    ) -> Outcome {
        let stage = self.config.name.call();
        let url = format!("{}{}", self.config.base_url, request.path);
        let mut builder = self.http.request(request.method.clone(), url);
        // Copied only when there is something to copy: most calls carry no header of
        // their own, and an empty map costs nothing until written to.
        for headers in [&request.headers, trace] {
            if !headers.is_empty() {
                builder = builder.headers(headers.clone());
            }
        }
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        let body = Body {
            downstream: self.config.name,
            limit: self.config.max_body,
            write: request.writes(),
        };
        let budget = deadline.outbound_millis(self.keep_back());
        if let Some(ms) = budget {
            builder = builder.header(REQUEST_TIMEOUT_HEADER, ms);
        }
        let previous = deadline.previous_attempts().unwrap_or(nth);
        builder = builder.header(PREVIOUS_ATTEMPTS_HEADER, previous);
        match deadline.mode() {
            DeadlineMode::Observe => {
                let builder = builder.header(DEADLINE_MODE_HEADER, OBSERVE);
                Ok(fetch(builder.timeout(self.config.timeout), body).await)
            }
            // No more than what is kept back is left: the budget is spent, no I/O.
            DeadlineMode::Propagate if budget.is_none() => Err(deadline.exceeded(stage)),
            // A read is cut at the deadline: boxed where it is made (`Deadline::run`), it
            // is never moved, and what is dropped there is only a read.
            DeadlineMode::Propagate if !body.write => {
                deadline.run(stage, fetch(builder, body)).await
            }
            // A write may be acted on once sent, whatever happens here: at the deadline it
            // is waited for a grace longer, for the downstream's answer (its own deadline
            // came first), and the ingress, polled after this, waits with it instead of
            // answering 504. Boxed, so that the read's path above stays small.
            DeadlineMode::Propagate => {
                let mut fetch = Box::pin(fetch(builder, body));
                match deadline.run(stage, &mut fetch).await {
                    Err(_) => {
                        let _no_return = deadline.point_of_no_return();
                        let grace = deadline.instant() + OUTCOME_GRACE;
                        Ok(timeout_at(grace, fetch)
                            .await
                            .unwrap_or(Err(Failed::Unknown)))
                    }
                    fetched => fetched,
                }
            }
        }
    }
}

impl CallRequest<'_> {
    /// Whether the request may be sent twice: `GET`, `HEAD`, marked idempotent, or
    /// carrying an `Idempotency-Key`.
    pub(super) fn repeatable(&self) -> bool {
        self.idempotent
            || self.method == Method::GET
            || self.method == Method::HEAD
            || self.headers.contains_key("idempotency-key")
    }
}

/// What an attempt's answer is read with.
#[derive(Clone, Copy)]
struct Body {
    downstream: crate::downstream::Downstream,
    limit: usize,
    write: bool,
}

/// Sends and reads the whole body: both belong inside the same timeout.
async fn fetch(request: reqwest::RequestBuilder, body: Body) -> Result<Reply, Failed> {
    let mut response = request.send().await.map_err(Failed::Http)?;
    let (status, headers) = (response.status(), response.headers().clone());
    Ok(Reply {
        status,
        headers,
        body: read_body(&mut response, body.limit).await?,
        downstream: body.downstream,
        write: body.write,
    })
}

/// The whole body, or `TooLarge` as soon as it passes `limit`, announced or read. The
/// rest is never read: the response dropped unread closes its connection, so nothing
/// the downstream still sends can reach the next call.
async fn read_body(response: &mut reqwest::Response, limit: usize) -> Result<Bytes, Failed> {
    let over = |len: u64| usize::try_from(len).map_or(true, |len| len > limit);
    if response.content_length().is_some_and(over) {
        return Err(Failed::TooLarge(limit));
    }
    // Most bodies come in one chunk: kept as it came, copied only when a second comes.
    let (mut first, mut whole) = (Bytes::new(), BytesMut::new());
    while let Some(chunk) = response.chunk().await.map_err(Failed::Http)? {
        if first.len() + whole.len() + chunk.len() > limit {
            return Err(Failed::TooLarge(limit));
        }
        match (first.is_empty(), whole.is_empty()) {
            (true, true) => first = chunk,
            (false, true) => {
                whole.extend_from_slice(&std::mem::take(&mut first));
                whole.extend_from_slice(&chunk);
            }
            _ => whole.extend_from_slice(&chunk),
        }
    }
    Ok(if whole.is_empty() {
        first
    } else {
        whole.freeze()
    })
}

/// An attempt not yet timed: dropped first (its caller went away, its hedge won), it is
/// told as cancelled and cut, or a slow downstream would read as fast.
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
            status: None,
            failure: "cancelled",
            censored: true,
            learns: self.learns,
        }));
    }
}
