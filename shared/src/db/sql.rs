//! The SQL the envelope sends: the batches that open and commit a transaction, each one
//! round trip of utility statements (`SET` needs no snapshot and no plan, unlike
//! `SELECT set_config(..)`), and whether the schema can leave work to COMMIT.

use std::borrow::Cow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgExecutor;
use tokio::time::Instant;

/// Read-write or read-only: whether the transaction is opened `READ ONLY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    ReadWrite,
    ReadOnly,
}

/// `BEGIN`, with the session's limit where the one in force does not serve (see
/// `session.rs`). `statement_timeout` bounds lock waits too, so no `lock_timeout`.
pub(crate) fn begin_sql(access: Access, limit_ms: Option<u64>) -> Cow<'static, str> {
    let begin = match access {
        Access::ReadWrite => "BEGIN",
        Access::ReadOnly => "BEGIN READ ONLY",
    };
    match limit_ms {
        // A simple query takes no bind parameters; the value is an integer.
        Some(limit_ms) => format!("{begin}; SET statement_timeout = {limit_ms}").into(),
        None => begin.into(),
    }
}

/// The batch that commits. PostgreSQL turns its statement timer off before COMMIT's
/// deferred work, so where the schema has any, `SET CONSTRAINTS ALL IMMEDIATE` fires it
/// first under a `LOCAL` limit of what is left; elsewhere `COMMIT` alone.
pub(crate) fn commit_sql(deferred: bool, limit_ms: u64) -> Cow<'static, str> {
    match deferred {
        true => format!(
            "SET LOCAL statement_timeout = {limit_ms}; SET CONSTRAINTS ALL IMMEDIATE; COMMIT"
        )
        .into(),
        false => "COMMIT".into(),
    }
}

/// Runs a batch above and reads its replies to the end, failing with the first error.
/// Read from sqlx's stream directly: `execute` adds two boxed layers per batch.
pub(super) async fn run_batch(
    conn: &mut sqlx::PgConnection,
    sql: Cow<'static, str>,
) -> Result<(), sqlx::Error> {
    use futures_util::TryStreamExt as _;
    use sqlx::Executor as _;

    let batch = match sql {
        Cow::Borrowed(sql) => sqlx::raw_sql(sql),
        Cow::Owned(sql) => sqlx::raw_sql(sqlx::AssertSqlSafe(sql)),
    };
    let mut replies = conn.fetch_many(batch);
    while replies.try_next().await?.is_some() {}
    Ok(())
}

/// Deferrable constraints and deferrable constraint triggers, in any schema.
pub(crate) const DEFERRED_WORK: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint \
     WHERE condeferrable) OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgdeferrable)";

/// How old a reading of the schema may get before a transaction asks for a new one.
const REFRESH: Duration = Duration::from_secs(60);

/// Whether the schema can leave work to COMMIT: read after migrations, on
/// `learn_schema`, and once a minute; until known, every COMMIT fires deferred work.
#[derive(Debug, Default)]
pub(super) struct DeferredWork {
    known: Mutex<Option<(bool, Instant)>>,
    /// A background reading is under way.
    reading: AtomicBool,
}

impl DeferredWork {
    /// Whether a COMMIT must fire deferred work first: yes until the schema is known.
    pub(super) fn possible(&self) -> bool {
        self.known().is_none_or(|(exists, _)| exists)
    }

    /// Whether a background reading should start now: the last is missing or old, and
    /// none is under way (the caller then starts it, and [`learn`](Self::learn) ends it).
    pub(super) fn claim_refresh(&self) -> bool {
        let stale = self.known().is_none_or(|(_, at)| at.elapsed() >= REFRESH);
        stale && !self.reading.swap(true, Ordering::AcqRel)
    }

    fn known(&self) -> Option<(bool, Instant)> {
        *self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the schema through `on`, keeps the reading, and says whether deferred work
    /// exists.
    pub(super) async fn learn<'e>(&self, on: impl PgExecutor<'e>) -> Result<bool, sqlx::Error> {
        let read = sqlx::query_scalar::<_, bool>(DEFERRED_WORK)
            .fetch_one(on)
            .await;
        self.reading.store(false, Ordering::Release);
        let exists = read?;
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) = Some((exists, Instant::now()));
        Ok(exists)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_schema_is_read_again_once_a_reading_is_old_and_one_reading_at_a_time() {
        let work = DeferredWork::default();
        assert!(
            work.possible(),
            "until the schema is read, deferred work is assumed"
        );
        assert!(work.claim_refresh());
        assert!(!work.claim_refresh(), "one reading at a time");
        work.reading.store(false, Ordering::Release);
        *work.known.lock().unwrap() = Some((false, Instant::now()));
        assert!(!work.possible());
        assert!(!work.claim_refresh(), "a fresh reading holds");
        tokio::time::advance(REFRESH).await;
        assert!(work.claim_refresh(), "a minute old: read again");
        assert!(!work.possible(), "the old reading still decides meanwhile");
    }
}
