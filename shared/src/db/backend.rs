//! [`Backends`]: which server process (backend) carries each pooled connection, and the
//! `statement_timeout` in force on it ([`SessionLimit`]), learned once per connection, so
//! that a statement can be cancelled on the server, and a limit reused, without a
//! statement added to every transaction.
//!
//! # Why not a marker per transaction
//!
//! A cancel from another session needs the backend's process id. The obvious way to
//! find it, naming each transaction in `pg_stat_activity` (`SET LOCAL
//! application_name` in the batch that opens it), costs a statement in every
//! transaction and two reports of the changed name from the server; measured, a few
//! per cent of the database's CPU per order. The process id of a connection never
//! changes, so it is learned once, when a connection first serves a transaction.
//!
//! sqlx hides the id (and the protocol's cancel key) and gives a pooled connection no
//! place to keep a value of one's own, so the connection is recognised by something it
//! does keep: its cache of prepared statements. Preparing [`IDENTIFY`] on a connection
//! that has it cached costs no I/O and hands back the cached statement's column list,
//! whose address is that connection's own; the map below holds the statement, so the
//! address cannot be reused by another connection while its entry lives. A connection
//! whose cached statement was evicted, or a driver that stopped caching, is only
//! learned again (one round trip), never mistaken for another.
//!
//! # Why a cancel cannot reach the wrong statement
//!
//! The transaction's task holds its connection until each cancel it sent has answered
//! (or closes the connection when one has not), so the backend runs nothing but that
//! transaction while a cancel can land. A backend's id is reused only after it exits,
//! so the cancel also names the backend's start time: a connection that died and whose
//! id went to a new session is never cancelled in its place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgStatement};
use sqlx::{Executor as _, SqlSafeStr as _, Statement as _};
use tokio::time::Instant;

use super::limit::SessionLimit;

/// The backend's process id and start, in microseconds since the epoch (an integer, so
/// the cancel can compare it exactly).
pub(super) const IDENTIFY: &str = "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::int8 \
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

/// What is known of one pooled connection's server session.
#[derive(Clone, Debug)]
pub(super) struct Session {
    /// Where a cancel is sent.
    pub(super) backend: Backend,
    /// The limit in force on it.
    pub(super) limit: Arc<SessionLimit>,
    /// When a transaction last began on it.
    pub(super) last_use: Arc<LastUse>,
}

/// When a session last began a transaction of the technique's, so that a connection
/// taken from the pool without sqlx's check is pinged when it may have sat idle for
/// long (`job.rs`). It counts from the start of that transaction, not its end: an
/// overestimate of the time idle, so a connection is pinged too often, never too
/// rarely. Transactions of the other modes do not renew it, which errs the same way.
#[derive(Debug)]
pub(super) struct LastUse(Mutex<Instant>);

impl LastUse {
    /// How long since the last use, `now` becoming the last use.
    pub(super) fn renew(&self, now: Instant) -> Duration {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let since = now.saturating_duration_since(*last);
        *last = now;
        since
    }
}

type Known = HashMap<usize, (PgStatement, Session)>;

/// The sessions of a pool's connections, by the address of each connection's cached
/// [`IDENTIFY`] statement.
#[derive(Debug)]
pub(super) struct Backends {
    known: Mutex<Known>,
    /// Entries kept at most: connections that closed leave theirs behind, so past this
    /// many the map starts again (each live connection is then learned once more).
    capacity: usize,
}

impl Backends {
    /// A map for a pool of `connections`.
    pub(super) fn new(connections: u32) -> Self {
        Self {
            known: Mutex::default(),
            capacity: (connections as usize * 4).max(16),
        }
    }

    /// The session of `conn`: known already (no I/O), or learned now (one round trip
    /// to prepare [`IDENTIFY`] the first time, one to run it). A session learned now
    /// starts with its limit unknown: it may be a new one, or one learned again after
    /// its entry was lost (evicted statement, map started again) with a limit in force.
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
            limit: Arc::new(SessionLimit::unknown()),
            // It has just answered a query.
            last_use: Arc::new(LastUse(Mutex::new(Instant::now()))),
        };
        let mut known = self.lock();
        if known.len() >= self.capacity {
            known.clear();
        }
        known.insert(key, (statement, session.clone()));
        Ok(session)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}
