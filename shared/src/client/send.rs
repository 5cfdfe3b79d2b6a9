//! Stage `{name}`: one request and its body under what is left of the deadline, with the
//! budget propagated, the trace context injected, at most one retry of a refused
//! connection, and the call's time recorded (metrics and the admission estimate).

use std::time::Duration;

use http::HeaderMap;
use http::header::HeaderName;
use tokio::time::Instant;
use tracing::Instrument;

use super::request::{CallRequest, Reply};
use super::wire::server_total;
use super::{BudgetedClient, CallError};
use crate::deadline::{Deadline, DeadlineExceeded};
use crate::header::{DEADLINE_MODE_HEADER, OBSERVE, REQUEST_TIMEOUT_HEADER};
use crate::ingress::DeadlineMode;
use crate::metrics::ClientMetrics;

/// The least budget worth a retry of a refused connection.
const MIN_RETRY_BUDGET: Duration = Duration::from_millis(20);

/// The headers the client sets itself; a caller's values for them are dropped, so no
/// caller can send more budget than is left, a mode that is not this call's, or a trace
/// context that is not this call's.
const OWNED_HEADERS: [HeaderName; 4] = [
    REQUEST_TIMEOUT_HEADER,
    DEADLINE_MODE_HEADER,
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
];

impl BudgetedClient {
    /// The request in a client span named after the method and the downstream
    /// (`POST inventory`), carrying the budget and what is left of it.
    pub(super) async fn send_request(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
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
        self.send_in(deadline, request, &span)
            .instrument(span.clone())
            .await
    }

    async fn send_in(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        span: &tracing::Span,
    ) -> Result<Reply, CallError> {
        let (name, stage) = (self.config.name.name(), self.config.name.call());
        let mode = deadline.mode();
        let spent = deadline.outbound_millis(self.keep_back()).is_none();
        if spent && mode == DeadlineMode::Propagate {
            // Nothing is sent, so there is nothing to learn from either.
            return Err(CallError::Deadline(deadline.exceeded(stage)));
        }
        let mut headers = request.headers.clone();
        for owned in &OWNED_HEADERS {
            headers.remove(owned);
        }
        crate::propagation::inject(span, &mut headers);
        let started = Instant::now();
        let unfinished = Unfinished {
            metrics: self.metrics.as_ref(),
            name,
            started,
        };
        let mut outcome = self.attempt(deadline, request, headers.clone()).await;
        // A refused connection sent nothing, so one retry is safe, for any method (a
        // POST included: the downstream never saw it), and worth it only if the budget
        // still allows a real call. A 504 from the downstream is never retried: the
        // shared deadline has run out there, and a retry would only spend what is left
        // for nothing.
        let refused = matches!(&outcome, Ok(Err(err)) if err.is_connect());
        if refused && mode == DeadlineMode::Propagate && deadline.remaining() > MIN_RETRY_BUDGET {
            if let Some(metrics) = &self.metrics {
                metrics.count_retry(name);
            }
            outcome = self.attempt(deadline, request, headers).await;
        }
        let took = started.elapsed();
        unfinished.finish();
        if let Ok(Ok(answer)) = &outcome {
            span.record("http.response.status_code", answer.status.as_u16());
            if let Some(server) = server_total(&answer.headers) {
                self.wire.record(took, server);
            }
        }
        // Cut at our deadline, or the downstream ran out of the budget we gave it: the
        // call would have taken at least this long (a censored observation).
        let censored = match &outcome {
            Err(_) => true,
            Ok(Ok(answer)) => answer.status == http::StatusCode::GATEWAY_TIMEOUT,
            Ok(Err(err)) => err.is_timeout(),
        };
        if let Some(admission) = self.admission.as_ref().filter(|_| request.admission) {
            admission.record(started, took, censored);
        }
        if mode == DeadlineMode::Observe && (spent || deadline.is_expired()) {
            deadline.would_refuse(stage, "deadline");
        }
        let (label, result) = match outcome {
            Err(exceeded) => ("timeout".to_owned(), Err(CallError::Deadline(exceeded))),
            Ok(Ok(answer)) => (
                answer.status.as_str().to_owned(),
                CallError::check(answer, deadline, stage),
            ),
            Ok(Err(err)) if err.is_timeout() => (
                "timeout".to_owned(),
                Err(CallError::Unreachable(err.to_string())),
            ),
            Ok(Err(err)) => (
                "error".to_owned(),
                Err(CallError::Unreachable(err.to_string())),
            ),
        };
        if let Some(metrics) = &self.metrics {
            metrics.observe_request(name, &label, took);
        }
        result
    }

    /// One request, bounded as the mode says.
    async fn attempt(
        &self,
        deadline: &Deadline,
        request: &CallRequest<'_>,
        mut headers: HeaderMap,
    ) -> Result<Result<Reply, reqwest::Error>, DeadlineExceeded> {
        let stage = self.config.name.call();
        let url = format!("{}{}", self.config.base_url, request.path);
        let budget = |headers: &mut HeaderMap| {
            let budget = deadline.outbound_millis(self.keep_back());
            if let Some(ms) = budget {
                headers.insert(REQUEST_TIMEOUT_HEADER, ms.into());
            }
            budget
        };
        let timeout = match deadline.mode() {
            DeadlineMode::Legacy => Some(deadline.legacy_timeout()),
            // The budget goes downstream (unless spent), but nothing here enforces it,
            // and the marker asks the downstream not to enforce it either.
            DeadlineMode::Observe => {
                budget(&mut headers);
                headers.insert(DEADLINE_MODE_HEADER, OBSERVE);
                Some(deadline.legacy_timeout())
            }
            DeadlineMode::Propagate => {
                // No more than the reserve left: the budget is spent, and no I/O starts.
                if budget(&mut headers).is_none() {
                    return Err(deadline.exceeded(stage));
                }
                None
            }
        };
        let mut builder = self
            .http
            .request(request.method.clone(), url)
            .headers(headers);
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        match timeout {
            Some(timeout) => Ok(fetch(builder.timeout(timeout)).await),
            None => deadline.run(stage, fetch(builder)).await,
        }
    }
}

/// Sends and reads the whole body: both belong inside the same timeout. The answer is
/// any status here; [`CallError::check`] sorts success from failure.
async fn fetch(request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// A call that has started and is not yet timed. If its future is dropped first (the
/// caller went away: a client that hangs up drops the handler, and the call in it), the
/// guard times it as `cancelled`. Without it the calls of callers who gave up would drop
/// out of the histogram, and a downstream slower than their patience would read as a
/// fast one.
struct Unfinished<'a> {
    metrics: Option<&'a ClientMetrics>,
    name: &'static str,
    started: Instant,
}

impl Unfinished<'_> {
    /// The call came back: the caller times it with its outcome.
    fn finish(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(metrics) = self.metrics {
            metrics.observe_request(self.name, "cancelled", self.started.elapsed());
        }
    }
}
