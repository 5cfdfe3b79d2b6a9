//! [`Problem`]: the one error answer, `application/problem+json` (RFC 9457). Deadline
//! answers carry `stage`, `budget_ms` and `elapsed_ms`, so a client sees *where* its
//! budget went; a 503 carries `Retry-After`. Internal causes never reach the body: they
//! travel in a response extension to the HTTP middleware, which logs them once.

use std::time::Duration;

use axum::response::IntoResponse;
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

use crate::deadline::DeadlineExceeded;
use crate::stage::Stage;

/// The media type of problem bodies.
const PROBLEM_JSON: &str = "application/problem+json";

/// An error answer, boxed so that `Result<T, Problem>` stays one pointer wide.
///
/// ```
/// use deadline_propagation::Problem;
/// use http::StatusCode;
///
/// async fn order(quantity: u32) -> Result<&'static str, Problem> {
///     if quantity == 0 {
///         let detail = "quantity must be at least 1";
///         return Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "urn:problem:validation", detail));
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

/// What the HTTP middleware logs of a failed request.
#[cfg_attr(
    not(feature = "metrics"),
    allow(dead_code, reason = "read by the metrics' middleware")
)]
#[derive(Debug, Clone)]
pub(crate) struct ProblemReport {
    pub status: StatusCode,
    pub stage: Option<Stage>,
    /// Never sent to the client.
    pub cause: Option<String>,
}

impl Problem {
    /// An answer with `status`, the problem type `kind` (a URN the client can match on)
    /// and a `detail` in words the client can act on.
    pub fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
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

    /// 400 for an invalid header, naming it in a `header` member.
    pub fn invalid_header(name: &'static str, detail: impl Into<String>) -> Self {
        let status = StatusCode::BAD_REQUEST;
        Self::new(status, "urn:problem:invalid-header", detail).with(|b| b.header = Some(name))
    }

    /// 404: the named thing does not exist.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "urn:problem:not-found", detail)
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
        let stage = exceeded.stage;
        let detail = format!("the request's time budget ran out in stage {stage}");
        let status = StatusCode::GATEWAY_TIMEOUT;
        Self::new(status, "urn:problem:deadline-exceeded", detail).with(|b| {
            b.stage = Some(stage);
            b.budget_ms = Some(millis(exceeded.budget));
            b.elapsed_ms = Some(millis(exceeded.elapsed));
        })
    }

    /// 503: refused before any work because `stage` is saturated; retry after
    /// `retry_after` (whole seconds, rounded up, at least 1).
    pub fn overloaded(stage: Stage, retry_after: Duration, detail: impl Into<String>) -> Self {
        let status = StatusCode::SERVICE_UNAVAILABLE;
        Self::new(status, "urn:problem:overloaded", detail).with(|b| {
            b.stage = Some(stage);
            b.retry_after_secs = Some(whole_seconds_up(retry_after).max(1));
        })
    }

    /// 503 for a dependency that is down (the database unreachable).
    pub fn unavailable(stage: Stage, cause: impl ToString) -> Self {
        let detail = format!("a dependency is unavailable ({stage})");
        Self::overloaded(stage, Duration::from_secs(1), detail)
            .with(|b| b.cause = Some(cause.to_string()))
    }

    /// 502: a downstream failed in a way that is not the client's fault.
    pub fn bad_gateway(stage: Stage, cause: impl ToString) -> Self {
        let detail = format!("the {stage} dependency failed");
        Self::new(StatusCode::BAD_GATEWAY, "urn:problem:bad-gateway", detail).with(|b| {
            b.stage = Some(stage);
            b.cause = Some(cause.to_string());
        })
    }

    /// 500: a bug or an unexpected failure. The cause is logged, never sent.
    pub fn internal(cause: impl ToString) -> Self {
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        Self::new(status, "urn:problem:internal", "internal error")
            .with(|b| b.cause = Some(cause.to_string()))
    }

    /// 500: a step that may have taken effect (a COMMIT, a write sent downstream) has an
    /// outcome not learned in time: unlike a 504 it does not promise nothing was written.
    pub fn outcome_unknown(stage: Stage) -> Self {
        let detail = format!(
            "stage {stage} may have taken effect and its outcome is unknown; retry with the \
             same Idempotency-Key to learn it"
        );
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        Self::new(status, "urn:problem:outcome-unknown", detail).with(|b| b.stage = Some(stage))
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The stage, for deadline and overload answers.
    pub fn stage(&self) -> Option<Stage> {
        self.0.stage
    }

    /// The explanation sent to the client.
    pub fn detail(&self) -> &str {
        &self.0.detail
    }
}

impl From<DeadlineExceeded> for Problem {
    fn from(exceeded: DeadlineExceeded) -> Self {
        Self::deadline(exceeded)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
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

/// Whole seconds for `Retry-After`, rounded up: never sooner than the wait.
fn whole_seconds_up(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
