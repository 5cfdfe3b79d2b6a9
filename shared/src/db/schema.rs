//! [`DeferredWork`]: whether the database's schema can leave work to COMMIT, learned
//! from the catalog tables so that a transaction pays for bounding that work only where
//! it exists.
//!
//! PostgreSQL switches its statement timer off before it commits and only then fires
//! the deferred work (deferred constraints, constraint triggers), so such work would run
//! unbounded inside COMMIT. Sending `SET CONSTRAINTS ALL IMMEDIATE` first, with the
//! limit re-set to what is left, fires it as an ordinary statement under the timer. A
//! schema with no deferrable constraint and no deferrable constraint trigger has no such
//! work, and then both statements are pure cost: COMMIT is sent alone (the limit set
//! at BEGIN is not re-set either, since a bare COMMIT runs outside the timer).
//!
//! The schema is read when the pool first serves a transaction, after
//! [`Db::migrate`](super::Db::migrate), on [`Db::learn_schema`](super::Db::learn_schema),
//! and again when the last reading is older than [`REFRESH`]; until a reading exists,
//! every COMMIT is sent with the deferred work fired. A schema changed outside the
//! service is still bounded in between: the cancel at the deadline aborts deferred work
//! as long as it runs (until the commit record is written).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgExecutor;
use sqlx::postgres::PgPool;
use tokio::time::Instant;

/// How old a reading of the schema may get before a transaction asks for a new one.
pub(super) const REFRESH: Duration = Duration::from_secs(60);

/// Deferrable constraints (foreign keys, unique and exclusion constraints) and
/// deferrable constraint triggers, in any schema of the database. `DEFERRABLE
/// INITIALLY IMMEDIATE` counts too: a transaction may defer it with `SET CONSTRAINTS`.
pub const QUERY: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE condeferrable) \
     OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgdeferrable)";

/// What is known of the schema's deferred work, shared by a pool's transactions.
#[derive(Debug, Default)]
pub(super) struct DeferredWork {
    /// The last reading: whether deferred work exists, and when it was read.
    known: Mutex<Option<(bool, Instant)>>,
    /// A reading is under way (at most one at a time).
    reading: AtomicBool,
}

impl DeferredWork {
    /// Whether a COMMIT must fire deferred work first: yes until the schema is known.
    pub(super) fn possible(&self) -> bool {
        self.known().is_none_or(|(exists, _)| exists)
    }

    /// Whether the schema should be read again (never read, or read too long ago).
    pub(super) fn stale(&self) -> bool {
        self.known().is_none_or(|(_, at)| at.elapsed() >= REFRESH)
    }

    fn known(&self) -> Option<(bool, Instant)> {
        *self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the schema through `on` and keeps the reading: whether deferred work exists.
    pub(super) async fn learn<'e>(&self, on: impl PgExecutor<'e>) -> Result<bool, sqlx::Error> {
        let exists = sqlx::query_scalar::<_, bool>(QUERY).fetch_one(on).await?;
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) = Some((exists, Instant::now()));
        Ok(exists)
    }

    /// Claims the one reading that may run in the background, if none is under way.
    pub(super) fn claim_reading(self: &Arc<Self>) -> Option<Reading> {
        (!self.reading.swap(true, Ordering::AcqRel)).then(|| Reading(self.clone()))
    }
}

/// A background reading under way; another may start once it is dropped.
pub(super) struct Reading(Arc<DeferredWork>);

impl Reading {
    /// Reads the schema on `pool` (see [`DeferredWork::learn`]).
    pub(super) async fn learn(&self, pool: &PgPool) -> Result<bool, sqlx::Error> {
        self.0.learn(pool).await
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.reading.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_the_schema_is_read_deferred_work_is_assumed() {
        let work = DeferredWork::default();
        assert!(work.possible());
        assert!(work.stale());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reading_holds_until_it_is_older_than_the_refresh() {
        let work = DeferredWork::default();
        *work.known.lock().unwrap() = Some((false, Instant::now()));
        assert!(!work.possible());
        assert!(!work.stale());
        tokio::time::advance(REFRESH).await;
        assert!(work.stale(), "a minute old: read again");
        assert!(!work.possible(), "the old reading still decides meanwhile");
    }

    #[test]
    fn one_background_reading_at_a_time() {
        let work = Arc::new(DeferredWork::default());
        let first = work.claim_reading();
        assert!(first.is_some());
        assert!(work.claim_reading().is_none());
        drop(first);
        assert!(work.claim_reading().is_some());
    }
}
