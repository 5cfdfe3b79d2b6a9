//! [`CallError`]: how a budgeted call failed, and the answer each failure becomes.
//!
//! The error knows the downstream it came from, so turning it into the answer needs
//! nothing else (`?` in a handler does it, through `From<CallError> for Problem`), and
//! the answer names that downstream's own stages: a full `inventory` pool is 503
//! `inventory_pool`, never `catalog_pool`. What went wrong is its [`kind`](CallError::kind);
//! the underlying error, where there is one (reqwest's, serde's), is its
//! [`source`](std::error::Error::source).

use std::time::Duration;

use http::{HeaderMap, StatusCode, header};

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::problem::Problem;
use crate::stage::{Downstream, Stage};

use super::Reply;

/// What went wrong with a budgeted call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallErrorKind {
    /// The bulkhead's queue was full: refused before any I/O, 503 `{name}_pool`.
    QueueFull,
    /// The wait for a bulkhead slot passed its limit: 503 `{name}_pool`.
    AcquireTimeout,
    /// Refused before taking a slot: recent calls say this one cannot finish in what it
    /// has left (admission). 503 with the call's stage.
    PredictedLate {
        /// Pool wait plus call time, as estimated.
        needed: Duration,
        /// What the call had to spend.
        available: Duration,
    },
    /// Our deadline ran out (while waiting for a slot, or during the call): 504.
    Deadline(DeadlineExceeded),
    /// The downstream answered 504: the shared deadline ran out there. Never retried.
    DownstreamDeadline(DeadlineExceeded),
    /// The downstream answered 503: passed on with its `Retry-After`.
    DownstreamOverloaded {
        /// From the downstream's `Retry-After`, or 1 s when it sends none or one that is
        /// not whole seconds.
        retry_after: Duration,
    },
    /// The downstream answered 404 for what we asked: the caller's input was wrong.
    NotFound,
    /// Any other non-success status: 502.
    Status(StatusCode),
    /// Connection refused or reset, or another transport failure: 502.
    Unreachable,
    /// A success status with a body we cannot read: 502.
    Invalid,
    /// The request could not be built (a header that is not valid HTTP, a body that
    /// does not serialize): our own mistake, found before any I/O. 500.
    Request,
}

/// A failed outbound call: which downstream, what went wrong, and why.
///
/// ```
/// use deadline_propagation::client::{CallError, CallErrorKind};
/// use deadline_propagation::Problem;
///
/// fn answer(err: CallError) -> Problem {
///     match err.kind() {
///         // A 404 from the downstream is the caller's mistake: say so in our words.
///         CallErrorKind::NotFound => Problem::not_found("no such item"),
///         // Everything else as the contract says: 504, 503 or 502, naming the stage.
///         _ => err.into(),
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{downstream}: {}", describe(kind))]
pub struct CallError {
    downstream: Downstream,
    kind: CallErrorKind,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

fn describe(kind: &CallErrorKind) -> String {
    match kind {
        CallErrorKind::QueueFull => "refused by the pool: the pool queue is full".to_owned(),
        CallErrorKind::AcquireTimeout => {
            "refused by the pool: timed out waiting for a pool slot".to_owned()
        }
        CallErrorKind::PredictedLate { needed, available } => {
            format!("predicted to finish late: needs about {needed:?}, has {available:?}")
        }
        CallErrorKind::Deadline(exceeded) => exceeded.to_string(),
        CallErrorKind::DownstreamDeadline(_) => "the downstream ran out of budget".to_owned(),
        CallErrorKind::DownstreamOverloaded { .. } => "the downstream is overloaded".to_owned(),
        CallErrorKind::NotFound => "not found downstream".to_owned(),
        CallErrorKind::Status(status) => format!("the downstream answered {status}"),
        CallErrorKind::Unreachable => "the downstream is unreachable".to_owned(),
        CallErrorKind::Invalid => "the downstream sent an invalid body".to_owned(),
        CallErrorKind::Request => "the request could not be built".to_owned(),
    }
}

/// The wait passed on with a downstream 503 whose `Retry-After` is missing or unreadable,
/// and the one a refusal of our own asks for.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The wait a downstream asks for in `Retry-After`, in delay-seconds (the form both
/// services send). The HTTP-date form counts as unreadable: turning it into a wait would
/// trust the other host's clock, which this project never does.
fn retry_after(headers: &HeaderMap) -> Duration {
    headers
        .get(header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse::<u64>().ok())
        .map_or(DEFAULT_RETRY_AFTER, Duration::from_secs)
}

impl CallError {
    pub(crate) fn new(downstream: Downstream, kind: CallErrorKind) -> Self {
        Self {
            downstream,
            kind,
            source: None,
        }
    }

    /// The same error, caused by `source`.
    pub(crate) fn caused_by(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> CallErrorKind {
        self.kind
    }

    /// The downstream the call went to.
    pub fn downstream(&self) -> Downstream {
        self.downstream
    }

    /// Sorts a downstream's answer: a 2xx is the reply, anything else an error. A 504
    /// counts as this request's deadline running out downstream.
    pub(crate) fn check(
        downstream: Downstream,
        answer: Reply,
        deadline: &Deadline,
    ) -> Result<Reply, CallError> {
        let kind = match answer.status.as_u16() {
            200..=299 => return Ok(answer),
            404 => CallErrorKind::NotFound,
            504 => CallErrorKind::DownstreamDeadline(deadline.exceeded(downstream.call())),
            // Passed on as the downstream said: it knows best when it will have room.
            503 => CallErrorKind::DownstreamOverloaded {
                retry_after: retry_after(&answer.headers),
            },
            _ => CallErrorKind::Status(answer.status),
        };
        Err(CallError::new(downstream, kind))
    }
}

/// The answer for a failed call, naming its downstream's stages: `{name}_pool` for a
/// refusal by its bulkhead, `{name}` for the rest (a deadline answer carries the stage
/// it ran out in). A bad request of our own is a 500, never blamed on the downstream.
impl From<CallError> for Problem {
    fn from(err: CallError) -> Self {
        let (stage, pool): (Stage, Stage) = (err.downstream.call(), err.downstream.pool());
        match err.kind {
            CallErrorKind::QueueFull | CallErrorKind::AcquireTimeout => Problem::overloaded(
                pool,
                DEFAULT_RETRY_AFTER,
                format!(
                    "no connection to the {stage} service: {}; retry later",
                    describe(&err.kind)
                ),
            ),
            CallErrorKind::PredictedLate { needed, available } => Problem::overloaded(
                stage,
                DEFAULT_RETRY_AFTER,
                format!(
                    "not sent to the {stage} service: recent calls need about {} ms, {} ms \
                     were left; retry later",
                    needed.as_millis(),
                    available.as_millis()
                ),
            ),
            CallErrorKind::Deadline(exceeded) | CallErrorKind::DownstreamDeadline(exceeded) => {
                Problem::deadline(exceeded)
            }
            CallErrorKind::DownstreamOverloaded { retry_after } => Problem::overloaded(
                stage,
                retry_after,
                format!("the {stage} service is overloaded; retry later"),
            ),
            CallErrorKind::NotFound => {
                Problem::not_found(format!("not found in the {stage} service"))
            }
            CallErrorKind::Request => Problem::internal(err),
            _ => Problem::bad_gateway(stage, err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_read_in_seconds_and_defaults_when_unreadable() {
        let cases = [
            (Some("7"), 7),
            (Some(" 120 "), 120),
            (Some("0"), 0),
            (None, 1),
            (Some("soon"), 1),
            (Some("-3"), 1),
            (Some("1.5"), 1),
            (Some("Wed, 21 Oct 2015 07:28:00 GMT"), 1),
        ];
        for (value, secs) in cases {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(header::RETRY_AFTER, value.parse().unwrap());
            }
            assert_eq!(
                retry_after(&headers),
                Duration::from_secs(secs),
                "{value:?}"
            );
        }
    }

    #[test]
    fn an_error_keeps_its_cause_and_names_its_downstream() {
        use std::error::Error as _;
        let inventory = Downstream::new("inventory").unwrap();
        let cause = std::io::Error::other("connection reset");
        let err = CallError::new(inventory, CallErrorKind::Unreachable).caused_by(cause);
        assert_eq!(err.source().unwrap().to_string(), "connection reset");
        assert_eq!(err.to_string(), "inventory: the downstream is unreachable");
        let problem = Problem::from(err);
        assert_eq!(problem.status(), StatusCode::BAD_GATEWAY);
        let full = Problem::from(CallError::new(inventory, CallErrorKind::QueueFull));
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(full.stage(), Some(inventory.pool()));
    }
}
