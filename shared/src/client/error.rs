//! [`CallError`]: how a budgeted call failed, and the answer each failure becomes. The
//! error knows its downstream, so `?` in a handler answers in that downstream's own
//! stages: a full `inventory` pool is 503 `inventory_pool`, never `catalog_pool`.

use std::time::Duration;

use http::{HeaderMap, StatusCode, header};

use super::Reply;
use crate::deadline::{Deadline, DeadlineExceeded};
use crate::downstream::Downstream;
use crate::problem::Problem;

/// What went wrong with a budgeted call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallErrorKind {
    /// The bulkhead's queue was full: refused before any I/O, 503 `{name}_pool`.
    #[error("refused by the pool: the pool queue is full")]
    QueueFull,
    /// The wait for a slot passed its limit: 503 `{name}_pool`.
    #[error("refused by the pool: timed out waiting for a pool slot")]
    AcquireTimeout,
    /// Refused before taking a slot: recent calls say it cannot finish in what it has
    /// left (admission). 503 with the call's stage.
    #[error("predicted to finish late: needs about {needed:?}, has {available:?}")]
    PredictedLate {
        /// Pool wait plus call time, as estimated.
        needed: Duration,
        /// What the call had to spend.
        available: Duration,
    },
    /// Our deadline ran out (waiting for a slot, or during the call): 504.
    #[error("{0}")]
    Deadline(DeadlineExceeded),
    /// The downstream answered 504: the shared deadline ran out there. Never retried.
    #[error("the downstream ran out of budget")]
    DownstreamDeadline(DeadlineExceeded),
    /// The downstream answered 503: passed on with its `Retry-After`.
    #[error("the downstream is overloaded")]
    DownstreamOverloaded {
        /// From the downstream's `Retry-After` (whole seconds), else 1 s.
        retry_after: Duration,
    },
    /// The downstream answered 404 for what we asked: the caller's input was wrong.
    #[error("not found downstream")]
    NotFound,
    /// Any other non-success status: 502.
    #[error("the downstream answered {0}")]
    Status(StatusCode),
    /// Connection refused or reset, or another transport failure: 502.
    #[error("the downstream is unreachable")]
    Unreachable,
    /// A success status with a body we cannot read: 502.
    #[error("the downstream sent an invalid body")]
    Invalid,
    /// A body longer than [`ClientConfig::max_body`](super::ClientConfig::max_body): 502.
    #[error("the downstream's body is longer than {0} bytes")]
    TooLarge(usize),
    /// The downstream may have acted and nobody here can learn whether in time: it said
    /// so itself (its `outcome-unknown`), or a write was sent and its answer did not
    /// come back by the deadline and the grace after it, or proved nothing.
    /// 500 `outcome-unknown`, never a status that says nothing was written.
    #[error("the downstream may have acted; the outcome is unknown")]
    OutcomeUnknown,
    /// The request could not be built (a bad header, a body that does not serialize):
    /// our own mistake, found before any I/O. 500.
    #[error("the request could not be built")]
    Request,
}

/// A failed outbound call: which downstream, what went wrong, and the underlying error
/// (reqwest's, serde's) as its source.
#[derive(Debug, thiserror::Error)]
#[error("{downstream}: {kind}")]
pub struct CallError {
    downstream: Downstream,
    kind: CallErrorKind,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
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

    /// The same failure, answered as unknown: the downstream may have acted on it.
    pub(crate) fn outcome_unknown(mut self) -> Self {
        self.kind = CallErrorKind::OutcomeUnknown;
        self
    }

    /// The downstream the call went to.
    pub fn downstream(&self) -> Downstream {
        self.downstream
    }

    /// Sorts an answer: a 2xx is the reply, anything else an error; a 504 is this
    /// request's deadline running out downstream.
    pub(crate) fn check(
        downstream: Downstream,
        answer: Reply,
        deadline: &Deadline,
    ) -> Result<Reply, CallError> {
        let kind = match answer.status.as_u16() {
            200..=299 => return Ok(answer),
            404 => CallErrorKind::NotFound,
            500 if is_outcome_unknown(&answer.body) => CallErrorKind::OutcomeUnknown,
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

/// Whether a 500's body is the contract's `outcome-unknown`: a JSON object whose `type`
/// says so. Anything else, an unreadable body included, is not (it stays a 502, or
/// unknown by the rule for writes). The body is already bounded by `max_body`.
pub(crate) fn is_outcome_unknown(body: &[u8]) -> bool {
    let problem = serde_json::from_slice::<serde_json::Value>(body);
    problem.is_ok_and(|p| p["type"] == "urn:problem:outcome-unknown")
}

impl CallErrorKind {
    /// Whether the downstream may have acted, had the request been a write: only a
    /// refused connection (nothing sent), a 4xx, and the contract's 502, 503 and 504
    /// (nothing written, the downstream promises) prove that it did not.
    pub(crate) fn may_have_acted(self) -> bool {
        match self {
            Self::Status(status) => status.is_server_error() && !matches!(status.as_u16(), 502),
            Self::Invalid | Self::TooLarge(_) | Self::OutcomeUnknown => true,
            _ => false,
        }
    }
}

/// The wait a downstream asks for in `Retry-After`, in delay-seconds; the HTTP-date
/// form, or none, is a second (turning a date into a wait would trust its clock).
fn retry_after(headers: &HeaderMap) -> Duration {
    headers
        .get(header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs)
}

/// The answer for a failed call: `{name}_pool` for a refusal by its bulkhead,
/// `{name}` for the rest. A bad request of our own is a 500, never blamed downstream.
impl From<CallError> for Problem {
    fn from(err: CallError) -> Self {
        let (stage, retry) = (err.downstream.call(), Duration::from_secs(1));
        match err.kind {
            CallErrorKind::QueueFull | CallErrorKind::AcquireTimeout => {
                let detail = format!(
                    "no connection to the {stage} service: {}; retry later",
                    err.kind
                );
                Problem::overloaded(err.downstream.pool(), retry, detail)
            }
            CallErrorKind::PredictedLate { needed, available } => {
                let (needed, available) = (needed.as_millis(), available.as_millis());
                let detail = format!(
                    "not sent to the {stage} service: recent calls need about {needed} ms, \
                     {available} ms were left; retry later"
                );
                Problem::overloaded(stage, retry, detail)
            }
            CallErrorKind::Deadline(exceeded) | CallErrorKind::DownstreamDeadline(exceeded) => {
                Problem::deadline(exceeded)
            }
            CallErrorKind::DownstreamOverloaded { retry_after } => {
                let detail = format!("the {stage} service is overloaded; retry later");
                Problem::overloaded(stage, retry_after, detail)
            }
            CallErrorKind::NotFound => {
                Problem::not_found(format!("not found in the {stage} service"))
            }
            CallErrorKind::Request => Problem::internal(err),
            CallErrorKind::OutcomeUnknown => Problem::outcome_unknown(stage),
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
