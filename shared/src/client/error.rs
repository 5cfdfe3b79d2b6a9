//! [`CallError`]: how a budgeted call failed, and the answer each failure becomes.

use std::time::Duration;

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::problem::Problem;
use crate::stage::Stage;

use super::bulkhead::AcquireError;

/// A failed outbound call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Refused by the bulkhead before any I/O: 503 `catalog_pool` with `Retry-After`.
    #[error("refused by the pool: {reason}")]
    Rejected {
        /// Queue full or acquire timeout.
        reason: AcquireError,
        /// How long the caller should wait before retrying.
        retry_after: Duration,
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
        /// From the downstream's `Retry-After`, or 1 s.
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
}

impl CallError {
    /// Maps a downstream status to success or the matching error.
    pub(crate) fn check(
        status: http::StatusCode,
        body: bytes::Bytes,
        deadline: &Deadline,
    ) -> Result<bytes::Bytes, CallError> {
        match status.as_u16() {
            200..=299 => Ok(body),
            404 => Err(CallError::NotFound),
            504 => Err(CallError::DownstreamDeadline(
                deadline.exceeded(Stage::Catalog),
            )),
            503 => Err(CallError::DownstreamOverloaded {
                retry_after: Duration::from_secs(1),
            }),
            _ => Err(CallError::Status(status)),
        }
    }

    /// The answer for this failure; `stage` names the call for 502s and 503s.
    pub fn into_problem(self, stage: Stage) -> Problem {
        match self {
            CallError::Rejected {
                reason,
                retry_after,
            } => Problem::overloaded(
                Stage::CatalogPool,
                retry_after,
                format!("no connection to the {stage} service: {reason}; retry later"),
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
            other => Problem::bad_gateway(stage, other),
        }
    }
}
