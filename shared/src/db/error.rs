//! [`DbError`]: what a failed database step answers, and [`classify`], which decides.

use std::time::Duration;

use sqlx::postgres::{PgDatabaseError, PgSeverity};

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
    /// PostgreSQL ended the transaction over another one: a serialization failure
    /// (40001), a deadlock (40P01), or a lock it was told not to wait for (55P03: `NOWAIT`,
    /// or a `lock_timeout` someone set; the crate sets none, since `statement_timeout`
    /// bounds lock waits, so this is never the budget). Nothing was written, and the same
    /// transaction may succeed when run again: 503 with `Retry-After`.
    #[error("the transaction conflicted with another")]
    Conflict(#[source] sqlx::Error),
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
            DbError::Conflict(err) => {
                let what = match sqlstate(&err).as_deref() {
                    Some("40P01") => "it was chosen to end a deadlock with another transaction",
                    Some("55P03") => "what it needed was locked, and it was told not to wait",
                    _ => "it conflicted with a concurrent transaction",
                };
                let detail = format!(
                    "the database ended the transaction: {what}; nothing was written, \
                     and it may succeed if sent again"
                );
                Problem::overloaded(Stage::Db, RETRY_CONFLICT_AFTER, detail)
            }
            DbError::OutcomeUnknown => Problem::outcome_unknown(Stage::Db),
            DbError::Query(err) => Problem::internal(err),
        }
    }
}

/// When a transaction that met another may be sent again: the other has usually ended
/// by then (a `Retry-After` counts whole seconds).
const RETRY_CONFLICT_AFTER: Duration = Duration::from_secs(1);

/// The SQLSTATE of an error the server reported.
fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(Into::into),
        _ => None,
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
    match sqlstate(&err).as_deref() {
        // query_canceled (statement_timeout, or our cancel),
        // idle_in_transaction_session_timeout: the budget ran out.
        Some("57014" | "25P03") => return exceeded(deadline, Stage::Db),
        // serialization_failure, deadlock_detected, lock_not_available.
        Some("40001" | "40P01" | "55P03") => return DbError::Conflict(err),
        // admin_shutdown, crash_shutdown, cannot_connect_now: the server is leaving.
        Some("57P01" | "57P02" | "57P03") => return DbError::Unavailable(Some(err)),
        _ => {}
    }
    match err {
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

/// Whether an error answered to COMMIT proves that nothing was committed: only an
/// `ERROR` in a session that goes on (after the commit record PostgreSQL reports only
/// `PANIC`); a lost connection, a `FATAL`, a protocol error prove nothing.
pub(crate) fn proves_rollback(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let Some(pg) = db.try_downcast_ref::<PgDatabaseError>() else {
        return false;
    };
    let code = pg.code();
    pg.severity() == PgSeverity::Error
        && !code.starts_with("08")
        && !code.starts_with("57P")
        && !code.starts_with("XX")
}
