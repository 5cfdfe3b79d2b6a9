//! What is known of each pooled connection's server session, learned once: its backend
//! (where a cancel is sent), the `statement_timeout` in force on it, and when it was
//! last used. Naming the backend in every transaction costs a statement each
//! (docs/performance.md). sqlx hides the process id and gives a connection no place to
//! keep a value, so a connection is known by its cached prepared [`IDENTIFY`]: preparing
//! it again costs no I/O and gives back the cached column list, whose address is that
//! connection's own. A cancel names the backend's start too, so a reused id is safe.
//!
//! The limit is the session's, not the transaction's, so that budgets alike send none
//! (a `SET LOCAL` in every transaction costs the database, docs/performance.md). It
//! serves a transaction when it is never later than wanted and at most a sixteenth
//! earlier; one sent is a thirty-second early, the middle of that window. A `SET` is
//! undone by ROLLBACK, so the value is unknown from the `SET` to the transaction's end,
//! and an unknown limit never serves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgStatement};
use sqlx::{Executor as _, SqlSafeStr as _, Statement as _};
use tokio::time::Instant;

/// The backend's process id and start, in microseconds since the epoch.
const IDENTIFY: &str = "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8 \
     FROM pg_catalog.pg_stat_activity WHERE pid = pg_catalog.pg_backend_pid()";

/// Cancels what the backend runs, if it is still the same session.
pub(super) const CANCEL: &str = "SELECT pg_catalog.pg_cancel_backend(pid) \
     FROM pg_catalog.pg_stat_activity \
     WHERE pid = $1 AND (extract(epoch FROM backend_start) * 1000000)::int8 = $2";

/// Whether the backend is still in a transaction (it has not ended it, or exited).
pub(super) const IN_TRANSACTION: &str = "SELECT count(*) FROM pg_catalog.pg_stat_activity \
     WHERE pid = $1 AND (extract(epoch FROM backend_start) * 1000000)::int8 = $2 \
     AND xact_start IS NOT NULL";

/// One server session: its process id and when it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Backend {
    pub(super) pid: i32,
    pub(super) started_us: i64,
}

/// What is known of one pooled connection's session.
#[derive(Clone, Debug)]
pub(super) struct Session {
    pub(super) backend: Backend,
    pub(super) limit: Arc<SessionLimit>,
    /// When a transaction last began on it (an overestimate of its idleness: a
    /// connection taken without sqlx's check is pinged too often, never too rarely).
    pub(super) last_use: Arc<Mutex<Instant>>,
}

impl Session {
    /// How long since the last use, `now` becoming the last use.
    pub(super) fn renew(&self, now: Instant) -> Duration {
        let mut last = self.last_use.lock().unwrap_or_else(|e| e.into_inner());
        let since = now.saturating_duration_since(*last);
        *last = now;
        since
    }
}

/// The sessions of a pool's connections, by the address of each one's cached
/// [`IDENTIFY`] statement.
#[derive(Debug)]
pub(super) struct Sessions {
    known: Mutex<HashMap<usize, (PgStatement, Session)>>,
    /// Closed connections leave their entries behind: past this many, start again.
    capacity: usize,
}

impl Sessions {
    pub(super) fn new(connections: u32) -> Self {
        Self {
            known: Mutex::default(),
            capacity: (connections as usize * 4).max(16),
        }
    }

    /// The session of `conn`: known (no I/O), or learned now (two round trips). One
    /// learned now starts with its limit unknown: it may have lost its entry with a
    /// limit in force.
    pub(super) async fn of(&self, conn: &mut PgConnection) -> Result<Session, sqlx::Error> {
        let statement = conn.prepare(IDENTIFY.into_sql_str()).await?;
        let key = statement.columns().as_ptr() as usize;
        if let Some((_, session)) = self.lock().get(&key) {
            return Ok(session.clone());
        }
        // Once per connection: boxed, so that the usual path's future stays small.
        let (pid, started_us) =
            Box::pin(sqlx::query_as::<_, (i32, i64)>(IDENTIFY).fetch_one(&mut *conn)).await?;
        let session = Session {
            backend: Backend { pid, started_us },
            limit: Arc::new(SessionLimit(AtomicU64::new(UNKNOWN))),
            last_use: Arc::new(Mutex::new(Instant::now())),
        };
        let mut known = self.lock();
        if known.len() >= self.capacity {
            known.clear();
        }
        known.insert(key, (statement, session.clone()));
        Ok(session)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, (PgStatement, Session)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The server's own value (a session reset by an observed transaction).
const SERVER_DEFAULT: u64 = 0;
/// A `SET` was sent whose transaction has not been seen to end.
const UNKNOWN: u64 = u64::MAX;

/// The `statement_timeout` in force on one session, as far as its pool knows.
#[derive(Debug)]
pub(super) struct SessionLimit(AtomicU64);

impl SessionLimit {
    /// What a transaction that wants `wanted_ms` must send: nothing when the limit in
    /// force serves it, else a [`Change`] (unknown until its transaction ends).
    pub(super) fn plan(self: &Arc<Self>, wanted_ms: u64) -> Option<Change> {
        let prior = self.0.load(Ordering::Acquire);
        let serves = prior != SERVER_DEFAULT
            && prior != UNKNOWN
            && prior <= wanted_ms
            && prior >= wanted_ms - wanted_ms / 16;
        if serves {
            return None;
        }
        self.0.store(UNKNOWN, Ordering::Release);
        Some(Change {
            slot: Arc::clone(self),
            prior,
            set: (wanted_ms - wanted_ms / 32).max(1),
        })
    }

    /// Whether an observed transaction must first reset the session to the server's
    /// own value.
    pub(super) fn needs_reset(&self) -> bool {
        self.0.load(Ordering::Acquire) != SERVER_DEFAULT
    }

    /// The session was reset to the server's own value.
    pub(super) fn was_reset(&self) {
        self.0.store(SERVER_DEFAULT, Ordering::Release);
    }
}

/// A limit sent inside a transaction: in force after COMMIT, undone by ROLLBACK.
#[derive(Debug)]
pub(super) struct Change {
    slot: Arc<SessionLimit>,
    prior: u64,
    set: u64,
}

impl Change {
    /// The limit to send, ms (at least 1: 0 would mean none).
    pub(super) fn ms(&self) -> u64 {
        self.set
    }

    pub(super) fn committed(&self) {
        self.slot.0.store(self.set, Ordering::Release);
    }

    pub(super) fn rolled_back(&self) {
        self.slot.0.store(self.prior, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_new_session_sends_its_limit_and_the_next_alike_budget_sends_none() {
        let session = Arc::new(SessionLimit(AtomicU64::new(UNKNOWN)));
        let change = session.plan(690).expect("a new session's limit is unknown");
        assert_eq!(change.ms(), 690 - 690 / 32);
        change.committed();
        assert!(session.plan(690).is_none());
        assert!(session.plan(680).is_none(), "3 % shorter still served");
        assert!(session.plan(700).is_none(), "3 % longer still served");
    }

    #[test]
    fn a_shorter_budget_than_the_limit_in_force_sends_its_own() {
        let session = Arc::new(SessionLimit(AtomicU64::new(UNKNOWN)));
        session.plan(690).unwrap().committed();
        let change = session.plan(300).expect("the limit in force is later");
        assert_eq!(change.ms(), 300 - 300 / 32);
    }

    #[test]
    fn a_much_longer_budget_sends_its_own() {
        let session = Arc::new(SessionLimit(AtomicU64::new(UNKNOWN)));
        session.plan(300).unwrap().committed();
        assert!(session.plan(2000).is_some(), "would stop far too early");
    }

    #[test]
    fn a_rolled_back_transaction_leaves_the_limit_before_it() {
        let session = Arc::new(SessionLimit(AtomicU64::new(UNKNOWN)));
        session.plan(690).unwrap().committed();
        session.plan(100).unwrap().rolled_back();
        assert!(session.plan(690).is_none(), "690's limit is in force again");
        let change = session.plan(100).unwrap();
        drop(change); // neither committed nor rolled back: unknown
        assert!(session.plan(690).is_some(), "an unknown limit never serves");
        assert!(session.needs_reset());
    }

    #[test]
    fn observe_resets_a_session_unless_it_has_the_servers_own() {
        let session = Arc::new(SessionLimit(AtomicU64::new(UNKNOWN)));
        assert!(
            session.needs_reset(),
            "a session just learned may carry a limit"
        );
        session.was_reset();
        assert!(!session.needs_reset());
        session.plan(690).unwrap().rolled_back();
        assert!(!session.needs_reset(), "rolled back to the server's own");
        session.plan(690).unwrap().committed();
        assert!(session.needs_reset());
        session.was_reset();
        assert!(!session.needs_reset());
        assert!(session.plan(690).is_some(), "the server's own never serves");
    }

    proptest! {
        /// Whatever came before on the session, the limit in force after planning is
        /// never later than wanted and at most a sixteenth earlier.
        #[test]
        fn the_limit_in_force_is_never_later_and_at_most_a_sixteenth_early(
            history in proptest::collection::vec((1u64..100_000, any::<bool>()), 0..8),
            wanted in 1u64..100_000,
        ) {
            let session = Arc::new(SessionLimit(AtomicU64::new(UNKNOWN)));
            for (earlier, commit) in history {
                if let Some(change) = session.plan(earlier) {
                    if commit { change.committed() } else { change.rolled_back() }
                }
            }
            let in_force = session.0.load(Ordering::Acquire);
            let limit = match session.plan(wanted) {
                Some(change) => change.ms(),
                None => in_force,
            };
            prop_assert!(limit >= 1 && limit <= wanted, "{limit} for {wanted}");
            prop_assert!(limit >= wanted - wanted / 16, "{limit} for {wanted}");
        }
    }
}
