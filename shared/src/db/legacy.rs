//! The legacy and observe paths of [`Db`]: a transaction as code without the
//! technique writes it, for the before/after comparison and a safe rollout.

use sqlx::Connection as _;
use sqlx::postgres::PgConnection;

use super::{Db, DbError, End, Statements, classify};
use crate::deadline::Deadline;
use crate::stage::Stage;

impl Db {
    /// The same transaction as code without the technique writes it: no budget, no
    /// server-side limits, statements dropped wherever the caller's future is dropped.
    /// The wait for a connection is bounded by the fixed legacy timeout only. `observe`
    /// counts where propagate would have refused it.
    pub(super) async fn legacy<T, B: Statements<T>>(
        &self,
        body: B,
        deadline: &Deadline,
        observe: bool,
    ) -> Result<T, DbError> {
        let observed = observe.then_some(deadline);
        let unbounded = Deadline::after(deadline.legacy_timeout());
        let started = tokio::time::Instant::now();
        let acquired = tokio::time::timeout(deadline.legacy_timeout(), self.pool.acquire()).await;
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
        let mut counted = false;
        if let Some(deadline) = observed {
            let reason = if started.elapsed() > self.config.acquire_timeout {
                Some("acquire_timeout")
            } else {
                deadline.is_expired().then_some("deadline")
            };
            if let Some(reason) = reason {
                deadline.would_refuse(Stage::DbPool, reason);
                counted = true;
            }
        }
        let _count_late_statements = observed.filter(|_| !counted).map(LateCheck);
        let value = match body(&mut tx).await {
            Ok(End::Commit(value) | End::CommitVerified(value, _)) => {
                tx.commit().await.map_err(DbError::Query)?;
                value
            }
            Ok(End::Rollback(value)) => value,
            Err(err) => return Err(classify(err, &unbounded, Stage::Db)),
        };
        Ok(value)
    }

    /// Resets a session that may carry a limit a propagate transaction left (see
    /// `limit.rs`) to the server's own, outside any transaction, so the legacy
    /// transaction runs as code without the technique would. Known sessions with the
    /// server's own value cost no I/O; each session is reset at most once per switch.
    async fn without_limit(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let session = self.backends.of(conn).await?;
        if session.limit.needs_reset() {
            sqlx::raw_sql("SET statement_timeout = DEFAULT")
                .execute(&mut *conn)
                .await?;
            session.limit.was_reset();
        }
        Ok(())
    }
}

/// Observe mode: counts a transaction that ended after its deadline, however it ended,
/// as the 504 `db` propagate would have answered.
struct LateCheck<'a>(&'a Deadline);

impl Drop for LateCheck<'_> {
    fn drop(&mut self) {
        if self.0.is_expired() {
            self.0.would_refuse(Stage::Db, "deadline");
        }
    }
}
