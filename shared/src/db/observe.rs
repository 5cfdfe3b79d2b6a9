//! The observe path of [`Db`]: a transaction as code without the technique runs it,
//! counting where propagate would have refused it.

use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::PgConnection;

use super::{Db, DbError, End, Statements, classify, proves_rollback};
use crate::deadline::Deadline;
use crate::stage::Stage;

/// How long an observed transaction waits for a connection: sqlx's own default, the
/// bound a pool without the technique has.
const OBSERVE_WAIT: Duration = Duration::from_secs(30);

impl Db {
    /// The transaction with no budget and no server-side limit, the wait for a
    /// connection bounded only by [`OBSERVE_WAIT`].
    pub(super) async fn observed<T, B: Statements<T>>(
        &self,
        body: B,
        deadline: &Deadline,
    ) -> Result<T, DbError> {
        // Errors are classified against a deadline of their own: observe answers no 504.
        let unbounded = Deadline::after(OBSERVE_WAIT);
        let started = tokio::time::Instant::now();
        let acquired = tokio::time::timeout(OBSERVE_WAIT, self.pool.acquire()).await;
        let mut conn = acquired
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
            .map_err(|err| classify(err, &unbounded, Stage::DbPool))?;
        self.without_limit(&mut conn)
            .await
            .map_err(|err| classify(err, &unbounded, Stage::Db))?;
        let mut tx = conn
            .begin()
            .await
            .map_err(|err| classify(err, &unbounded, Stage::Db))?;
        let reason = if started.elapsed() > self.config.acquire_timeout {
            Some("acquire_timeout")
        } else {
            deadline.is_expired().then_some("deadline")
        };
        if let Some(reason) = reason {
            deadline.would_refuse(Stage::DbPool, reason);
        }
        let _count_late_statements = reason.is_none().then_some(LateCheck(deadline));
        let value = match body(&mut tx).await {
            Ok(End::Commit(value) | End::CommitVerified(value, _)) => {
                // What the server said proves a rollback (a serialization failure is
                // a 503 to retry), or the outcome is unknown: never "nothing written"
                // for a COMMIT whose connection failed.
                tx.commit()
                    .await
                    .map_err(|err| match proves_rollback(&err) {
                        true => classify(err, &unbounded, Stage::Db),
                        false => DbError::OutcomeUnknown,
                    })?;
                value
            }
            Ok(End::Rollback(value)) => value,
            Err(err) => return Err(classify(err, &unbounded, Stage::Db)),
        };
        Ok(value)
    }

    /// Resets a session that may carry a limit a propagate transaction left (see
    /// `session.rs`) to the server's own, outside any transaction, so that an observed
    /// transaction runs as code without the technique would. Known sessions with the
    /// server's own value cost no I/O; each session is reset at most once per switch.
    async fn without_limit(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let session = self.sessions.of(conn).await?;
        if session.limit.needs_reset() {
            sqlx::raw_sql("SET statement_timeout = DEFAULT")
                .execute(&mut *conn)
                .await?;
            session.limit.was_reset();
        }
        Ok(())
    }
}

/// Counts a transaction that ended after its deadline, however it ended, as the 504
/// `db` propagate would have answered.
struct LateCheck<'a>(&'a Deadline);

impl Drop for LateCheck<'_> {
    fn drop(&mut self) {
        if self.0.is_expired() {
            self.0.would_refuse(Stage::Db, "deadline");
        }
    }
}
