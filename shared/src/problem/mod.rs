//! [`Problem`]: the one error answer, `application/problem+json` (RFC 9457).
//!
//! Deadline answers carry the extension members `stage`, `budget_ms` and `elapsed_ms`,
//! so a client sees *where* its budget went. A 503 also carries `Retry-After`: the
//! request was refused before any work was done and may be retried.
//!
//! `into_response` never logs. Internal causes are kept out of the body (the client
//! cannot act on them) and travel in a response extension ([`ProblemReport`]) to the
//! HTTP middleware, which logs each failed request once, at a level that fits.

use std::time::Duration;

use http::StatusCode;
use serde::Serialize;

use crate::deadline::DeadlineExceeded;
use crate::stage::Stage;

/// The media type of problem bodies.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer. Build one with the constructors; each names what went wrong in
/// words the client can act on. Boxed, so `Result<T, Problem>` stays one pointer wide on
/// the happy path.
///
/// ```
/// use deadline_propagation::{Deadline, Problem};
///
/// // Handlers return `Result<_, Problem>`; with the `axum` feature it is the response.
/// async fn order(deadline: Deadline, quantity: u32) -> Result<&'static str, Problem> {
///     if quantity == 0 {
///         return Err(Problem::unprocessable("quantity must be at least 1"));
///     }
///     Ok("created")
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Problem(Box<Body>);

/// The serialized members (RFC 9457 plus this project's extensions).
#[derive(Debug, Clone, Serialize)]
struct Body {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    stage: Option<Stage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    budget_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    elapsed_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    header: Option<&'static str>,
    #[serde(skip)]
    retry_after_secs: Option<u64>,
    #[serde(skip)]
    cause: Option<String>,
}

/// What the HTTP middleware needs to log a failed request; put into the response's
/// extensions by `Problem::into_response` (feature `axum`).
#[cfg_attr(
    not(feature = "metrics"),
    allow(
        dead_code,
        reason = "read by the HTTP middleware, which comes with `metrics`"
    )
)]
#[derive(Debug, Clone)]
pub(crate) struct ProblemReport {
    /// The HTTP status sent.
    pub status: StatusCode,
    /// The stage for deadline and overload answers.
    pub stage: Option<Stage>,
    /// The internal cause, never sent to the client.
    pub cause: Option<String>,
}

impl Problem {
    fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        Self(Box::new(Body {
            kind,
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: detail.into(),
            stage: None,
            budget_ms: None,
            elapsed_ms: None,
            header: None,
            retry_after_secs: None,
            cause: None,
        }))
    }

    fn with(mut self, f: impl FnOnce(&mut Body)) -> Self {
        f(&mut self.0);
        self
    }

    /// 400: the request cannot be understood (malformed JSON, a bad header).
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "urn:problem:bad-request", detail)
    }

    /// 400 for an invalid header, naming it in a `header` member.
    pub fn invalid_header(name: &'static str, detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "urn:problem:invalid-header",
            detail,
        )
        .with(|b| b.header = Some(name))
    }

    /// 403: the client may not use this endpoint.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "urn:problem:forbidden", detail)
    }

    /// 404: the named thing does not exist.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "urn:problem:not-found", detail)
    }

    /// 409: the request conflicts with the current state (not enough stock).
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "urn:problem:conflict", detail)
    }

    /// 413: the body is over the limit.
    pub fn payload_too_large(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "urn:problem:payload-too-large",
            detail,
        )
    }

    /// 415: the body is not JSON.
    pub fn unsupported_media_type(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "urn:problem:unsupported-media-type",
            detail,
        )
    }

    /// 422: well-formed, but a value is missing or out of range.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "urn:problem:validation",
            detail,
        )
    }

    /// 504: the budget ran out in `exceeded.stage`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use deadline_propagation::{DeadlineExceeded, Problem, Stage};
    ///
    /// let problem = Problem::deadline(DeadlineExceeded {
    ///     stage: Stage::named("catalog"),
    ///     budget: Duration::from_millis(300),
    ///     elapsed: Duration::from_millis(301),
    /// });
    /// assert_eq!((problem.status().as_u16(), problem.stage()), (504, Some(Stage::named("catalog"))));
    /// ```
    pub fn deadline(exceeded: DeadlineExceeded) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "urn:problem:deadline-exceeded",
            format!(
                "the request's time budget ran out in stage {}",
                exceeded.stage
            ),
        )
        .with(|b| {
            b.stage = Some(exceeded.stage);
            b.budget_ms = Some(millis(exceeded.budget));
            b.elapsed_ms = Some(millis(exceeded.elapsed));
        })
    }

    /// 503: refused before any work because `stage` is saturated; retry after
    /// `retry_after` (rounded up to whole seconds, at least 1, as `Retry-After` needs).
    ///
    /// ```
    /// use std::time::Duration;
    /// use deadline_propagation::{Downstream, Problem};
    ///
    /// // Sent with `Retry-After: 1` (40 ms rounded up to a whole second).
    /// let problem = Problem::overloaded(Downstream::new("catalog").unwrap().pool(), Duration::from_millis(40), "queue full");
    /// assert_eq!(problem.status().as_u16(), 503);
    /// ```
    pub fn overloaded(stage: Stage, retry_after: Duration, detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "urn:problem:overloaded",
            detail,
        )
        .with(|b| {
            b.stage = Some(stage);
            b.retry_after_secs = Some(whole_seconds_up(retry_after).max(1));
        })
    }

    /// 503 for a dependency that is down (database unreachable).
    pub fn unavailable(stage: Stage, cause: impl ToString) -> Self {
        Self::overloaded(
            stage,
            Duration::from_secs(1),
            format!("a dependency is unavailable ({stage})"),
        )
        .with(|b| b.cause = Some(cause.to_string()))
    }

    /// 502: a downstream failed in a way that is not the client's fault.
    pub fn bad_gateway(stage: Stage, cause: impl ToString) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "urn:problem:bad-gateway",
            format!("the {stage} dependency failed"),
        )
        .with(|b| {
            b.stage = Some(stage);
            b.cause = Some(cause.to_string());
        })
    }

    /// 500: a bug or an unexpected failure. The cause is logged, never sent.
    pub fn internal(cause: impl ToString) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "urn:problem:internal",
            "internal error",
        )
        .with(|b| b.cause = Some(cause.to_string()))
    }

    /// 500: a COMMIT was sent but its outcome could not be learned in time. Unlike a
    /// 504, this does not promise that nothing was written: a retry with the same
    /// `Idempotency-Key` finds the order if it was committed.
    pub fn outcome_unknown(stage: Stage) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "urn:problem:outcome-unknown",
            "the commit was sent but its outcome is unknown; retry with the same \
             Idempotency-Key to learn it",
        )
        .with(|b| b.stage = Some(stage))
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The stage, for deadline and overload answers.
    pub fn stage(&self) -> Option<Stage> {
        self.0.stage
    }

    /// The human-readable explanation sent to the client.
    pub fn detail(&self) -> &str {
        &self.0.detail
    }
}

impl From<DeadlineExceeded> for Problem {
    fn from(exceeded: DeadlineExceeded) -> Self {
        Self::deadline(exceeded)
    }
}

/// The answer itself; with the `axum` feature (the rest of this module is the core).
impl axum::response::IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
        use http::{HeaderValue, header};

        let status = self.status();
        let body = *self.0;
        let report = ProblemReport {
            status,
            stage: body.stage,
            cause: body.cause.clone(),
        };
        let retry_after = body.retry_after_secs;
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response.extensions_mut().insert(report);
        response
    }
}

/// `Retry-After` counts whole seconds. Rounding down would tell a client to come back
/// before the wait is over (1.5 s as "1"), so any fraction counts as one more second.
fn whole_seconds_up(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
