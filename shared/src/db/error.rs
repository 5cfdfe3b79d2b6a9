//! [`DbError`]: what a failed database step answers, and [`classify`], which decides.

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::problem::Problem;
use crate::stage::Stage;

/// A failed database step.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The budget ran out (client-side bound or server-side cancel); nothing was
    /// written: 504.
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
    /// The database is unreachable or the pool is saturated, or a COMMIT whose
    /// connection was lost turned out not to have committed; nothing was written: 503.
    /// The driver's error, where there was one, is the source.
    #[error("database unavailable")]
    Unavailable(#[source] Option<sqlx::Error>),
    /// COMMIT was sent but its outcome could not be learned within 250 ms
    /// past the deadline: 500, which promises nothing (a 504 would say "not written").
    #[error("the outcome of the commit is unknown")]
    OutcomeUnknown,
    /// Anything else: a bug or a constraint we did not expect: 500.
    #[error("database error: {0}")]
    Query(#[source] sqlx::Error),
}

impl From<DbError> for Problem {
    fn from(err: DbError) -> Self {
        match err {
            DbError::Deadline(exceeded) => Problem::deadline(exceeded),
            DbError::Unavailable(cause) => {
                let cause = cause.map_or("nothing was committed".to_owned(), |e| e.to_string());
                Problem::unavailable(Stage::DbPool, cause)
            }
            DbError::OutcomeUnknown => Problem::outcome_unknown(Stage::Db),
            DbError::Query(err) => Problem::internal(err),
        }
    }
}

/// Maps a sqlx error to what the caller should answer.
pub(crate) fn classify(err: sqlx::Error, deadline: &Deadline, stage: Stage) -> DbError {
    match &err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // query_canceled (statement_timeout, or our pg_cancel_backend at the
            // deadline) and lock_not_available (lock_timeout): the budget ran out.
            // idle_in_transaction_session_timeout (25P03) means the same, later.
            Some("57014" | "55P03" | "25P03") => DbError::Deadline(deadline.exceeded(Stage::Db)),
            // admin_shutdown, crash_shutdown, cannot_connect_now: the server is going away.
            Some("57P01" | "57P02" | "57P03") => DbError::Unavailable(Some(err)),
            _ => DbError::Query(err),
        },
        sqlx::Error::PoolTimedOut if deadline.is_expired() => {
            DbError::Deadline(deadline.exceeded(stage))
        }
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => DbError::Unavailable(Some(err)),
        _ => DbError::Query(err),
    }
}
