//! [`CallError`]: how a budgeted call failed, and the answer each failure becomes.
//!
//! The answer names the downstream's own stages ([`Downstream`]): a full `inventory`
//! pool is 503 `inventory_pool`, never `catalog_pool`.

use std::time::Duration;

use http::{HeaderMap, header};

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::problem::Problem;
use crate::stage::{Downstream, Stage};

use super::Reply;
use super::bulkhead::AcquireError;

/// A failed outbound call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Refused by the bulkhead before any I/O: 503 `{name}_pool` with `Retry-After`.
    #[error("refused by the pool: {reason}")]
    Rejected {
        /// Queue full or acquire timeout.
        reason: AcquireError,
        /// How long the caller should wait before retrying.
        retry_after: Duration,
    },
    /// Refused before taking a slot: recent calls say this one cannot finish in what it
    /// has left (the client's admission, docs/design.md §4.1). 503 with the call's stage.
    #[error("predicted to finish late: needs about {needed:?}, has {available:?}")]
    PredictedLate {
        /// Pool wait plus call time, as estimated.
        needed: Duration,
        /// What the call had to spend.
        available: Duration,
    },
    /// Our deadline ran out (while waiting for a slot, or during the call): 504.
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
    /// The downstream answered 504: the shared deadline ran out there. Never retried.
    #[error("the downstream ran out of budget")]
    DownstreamDeadline(DeadlineExceeded),
    /// The downstream answered 503: passed on with its `Retry-After`.
    #[error("the downstream is overloaded")]
    DownstreamOverloaded {
        /// From the downstream's `Retry-After`, or 1 s when it sends none or one that is not whole seconds.
        retry_after: Duration,
    },
    /// The downstream answered 404 for what we asked: the caller's input was wrong.
    #[error("not found downstream")]
    NotFound,
    /// Any other non-success status: 502.
    #[error("the downstream answered {0}")]
    Status(http::StatusCode),
    /// Connection refused, reset, or a reqwest failure: 502.
    #[error("the downstream is unreachable: {0}")]
    Unreachable(String),
    /// A success status with a body we cannot read: 502.
    #[error("the downstream sent an invalid body: {0}")]
    Invalid(String),
    /// The request could not be built (a header that is not valid HTTP, a body that
    /// does not serialize): our own mistake, found before any I/O. 500.
    #[error("the request could not be built: {0}")]
    Request(String),
}

/// The wait passed on with a downstream 503 whose `Retry-After` is missing or unreadable.
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
    /// Maps a downstream's answer to success or the matching error; a 504 names
    /// `stage`, the call's own.
    pub(crate) fn check(
        answer: Reply,
        deadline: &Deadline,
        stage: Stage,
    ) -> Result<Reply, CallError> {
        match answer.status.as_u16() {
            200..=299 => Ok(answer),
            404 => Err(CallError::NotFound),
            504 => Err(CallError::DownstreamDeadline(deadline.exceeded(stage))),
            // Passed on as the downstream said: it knows best when it will have room.
            503 => Err(CallError::DownstreamOverloaded {
                retry_after: retry_after(&answer.headers),
            }),
            _ => Err(CallError::Status(answer.status)),
        }
    }

    /// The answer for this failure, naming `downstream`'s stages: `{name}_pool` for a
    /// refusal by its bulkhead, `{name}` for the rest (a deadline answer carries the
    /// stage it ran out in). A bad request of our own is a 500, never blamed on the
    /// downstream.
    pub fn into_problem(self, downstream: Downstream) -> Problem {
        let stage = downstream.call();
        match self {
            CallError::Rejected {
                reason,
                retry_after,
            } => Problem::overloaded(
                downstream.pool(),
                retry_after,
                format!("no connection to the {stage} service: {reason}; retry later"),
            ),
            CallError::PredictedLate { needed, available } => Problem::overloaded(
                stage,
                DEFAULT_RETRY_AFTER,
                format!(
                    "not sent to the {stage} service: recent calls need about {} ms, {} ms \
                     were left; retry later",
                    needed.as_millis(),
                    available.as_millis()
                ),
            ),
            CallError::Deadline(exceeded) | CallError::DownstreamDeadline(exceeded) => {
                Problem::deadline(exceeded)
            }
            CallError::DownstreamOverloaded { retry_after } => Problem::overloaded(
                stage,
                retry_after,
                format!("the {stage} service is overloaded; retry later"),
            ),
            CallError::NotFound => Problem::not_found(format!("not found in the {stage} service")),
            CallError::Request(why) => Problem::internal(why),
            other => Problem::bad_gateway(stage, other),
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
}
