//! [`DbError`]: what a failed database step answers, and [`classify`], which decides.

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::problem::Problem;
use crate::stage::Stage;

/// A failed database step.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The budget ran out (on the client or the server); nothing was written: 504.
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
    /// The database is unreachable or its pool saturated, or a COMMIT whose connection
    /// was lost turned out not to have committed; nothing was written: 503.
    #[error("database unavailable")]
    Unavailable(#[source] Option<sqlx::Error>),
    /// COMMIT was sent but its outcome could not be learned within 250 ms past the
    /// deadline: 500, which promises nothing (a 504 would say "not written").
    #[error("the outcome of the commit is unknown")]
    OutcomeUnknown,
    /// Anything else: a bug or a constraint the caller did not expect: 500.
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

/// The budget spent in `stage`, not yet counted: whoever gives the answer counts it.
pub(super) fn exceeded(deadline: &Deadline, stage: Stage) -> DbError {
    DbError::Deadline(DeadlineExceeded {
        stage,
        budget: deadline.budget(),
        elapsed: deadline.elapsed(),
    })
}

/// Maps a sqlx error to what the caller answers.
pub(crate) fn classify(err: sqlx::Error, deadline: &Deadline, stage: Stage) -> DbError {
    match &err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // query_canceled (statement_timeout, or our cancel), lock_not_available,
            // idle_in_transaction_session_timeout: the budget ran out.
            Some("57014" | "55P03" | "25P03") => exceeded(deadline, Stage::Db),
            // admin_shutdown, crash_shutdown, cannot_connect_now: the server is leaving.
            Some("57P01" | "57P02" | "57P03") => DbError::Unavailable(Some(err)),
            _ => DbError::Query(err),
        },
        sqlx::Error::PoolTimedOut if deadline.is_expired() => exceeded(deadline, stage),
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => DbError::Unavailable(Some(err)),
        _ => DbError::Query(err),
    }
}
