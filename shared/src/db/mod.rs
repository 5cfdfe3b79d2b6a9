//! PostgreSQL under the deadline: [`Db::transaction`] and [`Db::read`] are the only way
//! to run SQL (there is no public pool), so no statement runs outside the budget.
//!
//! A success means committed; a 504, 503 or 502 means nothing was written, so a client
//! may retry even without an `Idempotency-Key`. Once COMMIT is on the wire the server
//! may commit whatever the client does, so COMMIT is a point of no return: not started
//! with too little left, its deferred work fired first under the limit, cancelled at
//! the deadline (which aborts it until the commit record is written), its outcome
//! awaited (250 ms past the deadline at most) and answered truthfully: only an error
//! the server reports in a session that goes on proves a rollback; otherwise the
//! outcome is learned on another connection ([`End::CommitVerified`]) or is a 500 that
//! promises nothing, never a 504.
//!
//! One transaction: `db_pool`, a connection within `min(acquire timeout, remaining)`
//! (a saturated database is a quick 503, not a slow 504); then `db`: `BEGIN` with `SET
//! statement_timeout` to what is left where the session's does not fit (`session.rs`,
//! `sql.rs`), the body's statements, which the server stops at the deadline (57014,
//! 504 `db`), and COMMIT or ROLLBACK as the body says.
//!
//! Dropping a sqlx future mid-statement leaves its connection out of step (sqlx then
//! closes it: a reconnect per cancel, when the database is busiest), so each
//! transaction is a job (`job.rs`) that owns its connection: when the caller goes away,
//! or the deadline passes before the server's limit fires, it cancels the statement on
//! the server (`pg_cancel_backend`, from a side pool), reads it to its end, rolls back
//! and returns the connection in step. The caller's answer comes as soon as it is known,
//! at its deadline at the latest (`handoff.rs`); the cleanup finishes after.
//!
//! The statement limit and the cancel reach the server only while the network does, so
//! every session also carries bounds the server keeps by itself ([`DbConfig`]).

mod error;
mod handoff;
mod job;
mod observe;
mod session;
pub(crate) mod sql;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, migrate::Migrator};

use crate::deadline::Deadline;
use crate::mode::DeadlineMode;

pub use error::DbError;
pub(crate) use error::{classify, proves_rollback};
use handoff::Handoff;
use job::Job;
use session::Sessions;
use sql::{Access, DeferredWork};

/// What a transaction's body decides: commit or roll back, with the value to return.
#[derive(Debug)]
pub enum End<T> {
    /// Commit, then return the value. Should the connection be lost once COMMIT is
    /// sent, the answer is [`DbError::OutcomeUnknown`].
    Commit(T),
    /// Commit, and should the connection be lost once COMMIT is sent, learn whether it
    /// committed by running the [`Check`] on another connection.
    CommitVerified(T, Check),
    /// Roll back and return the value (a read, or nothing to write).
    Rollback(T),
}

/// A read that tells whether a transaction committed, for a COMMIT whose connection was
/// lost: "does the row I inserted exist", run once the transaction has ended.
pub struct Check(Box<dyn Read<bool>>);

impl Check {
    /// The check `read`: `true` when the transaction's writes are in the table.
    pub fn new(read: impl Read<bool>) -> Self {
        Self(Box::new(read))
    }

    async fn run(self, conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        (self.0)(conn).await
    }
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Check")
    }
}

/// A transaction's statements on its connection, ending in what to do ([`End`]).
/// Write it as `|conn| Box::pin(async move { ... })`, queries on `&mut *conn`. It must
/// only run SQL: the job cancels the statement in flight, and only that.
pub trait Statements<T>:
    for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<End<T>, sqlx::Error>> + Send + 'static
{
}

impl<T, F> Statements<T> for F where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<End<T>, sqlx::Error>>
        + Send
        + 'static
{
}

/// The statements of a read ([`Db::read`]): written like [`Statements`], without the
/// [`End`].
pub trait Read<T>:
    for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, sqlx::Error>> + Send + 'static
{
}

impl<T, F> Read<T> for F where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, sqlx::Error>>
        + Send
        + 'static
{
}

/// Pool settings, and the bounds the server keeps on each session by itself: with the
/// link cut (no reset), neither the limit nor a cancel arrives, and a transaction would
/// sit `idle in transaction` with its locks for minutes. So every session carries, as
/// startup options, `idle_in_transaction_session_timeout` (a body runs only SQL, so a
/// live client waits a round trip at most) and `tcp_user_timeout` with keepalives and
/// `client_connection_check_interval` (a statement whose client is gone stops). Zero
/// switches a bound off.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct DbConfig {
    /// Pool size (10).
    pub max_connections: u32,
    /// The longest a request waits for a connection (250 ms): then 503 `db_pool`.
    pub acquire_timeout: Duration,
    /// How long the server lets a transaction wait for its client (500 ms).
    pub idle_in_transaction: Duration,
    /// How long the server waits for a silent client's TCP connection (1 s).
    pub liveness: Duration,
}

impl Default for DbConfig {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_millis(250),
            idle_in_transaction: Duration::from_millis(500),
            liveness: Duration::from_secs(1),
        }
    }
}

impl DbConfig {
    /// The startup options that carry the bounds to the server (a pool of your own
    /// can carry them too).
    pub fn session_bounds(&self) -> Vec<(&'static str, u128)> {
        let mut bounds = Vec::new();
        let idle = self.idle_in_transaction.as_millis();
        if idle > 0 {
            bounds.push(("idle_in_transaction_session_timeout", idle));
        }
        let liveness = self.liveness.as_millis();
        if liveness > 0 {
            // Keepalives count whole seconds; the user timeout gives up on them.
            bounds.extend([
                ("tcp_user_timeout", liveness),
                ("tcp_keepalives_idle", 1),
                ("tcp_keepalives_interval", 1),
                ("client_connection_check_interval", (liveness / 4).max(1)),
            ]);
        }
        bounds
    }
}

/// A connection idle longer than this is pinged on its way out of the pool, as pgx's
/// pool does: sqlx pings every one, a round trip per transaction.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// The pools and what they know. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
    /// Sends cancels and learns outcomes; apart, so a saturated pool cannot block it.
    side_pool: PgPool,
    sessions: Arc<Sessions>,
    deferred: Arc<DeferredWork>,
    /// The plain connection settings, for migrations; shared, so that a clone of `Db`
    /// (one per request, in a handler's state) copies no strings.
    options: Arc<PgConnectOptions>,
    config: DbConfig,
    /// Requests waiting for a connection now.
    pending: Arc<AtomicUsize>,
}

impl Db {
    /// A lazily connecting pool: the service starts while the database is down, and
    /// answers 503 until it is back.
    pub fn connect_lazy(url: &str, config: DbConfig) -> Result<Self, sqlx::Error> {
        let options: PgConnectOptions = url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for < PING_AFTER_IDLE {
                        return Ok(true);
                    }
                    conn.ping().await.map(|()| true)
                })
            })
            .connect_lazy_with(options.clone().options(config.session_bounds()));
        let side_pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy_with(options.clone().application_name("deadline-side"));
        Ok(Self {
            pool,
            side_pool,
            sessions: Arc::new(Sessions::new(config.max_connections)),
            deferred: Arc::default(),
            options: Arc::new(options),
            config,
            pending: Arc::default(),
        })
    }

    /// Applies `migrator` on a connection of its own, outside the per-request limits,
    /// then reads the schema (see [`learn_schema`](Self::learn_schema)).
    pub async fn migrate(&self, migrator: &Migrator) -> Result<(), sqlx::migrate::MigrateError> {
        let mut conn = PgConnection::connect_with(&self.options).await?;
        let mut result = migrator.run(&mut conn).await;
        if result.is_ok() {
            result = self
                .deferred
                .learn(&mut conn)
                .await
                .map(drop)
                .map_err(Into::into);
        }
        let _ = conn.close().await;
        result
    }

    /// Reads from the catalog tables whether the schema can leave work to COMMIT, as
    /// the pool does by itself once a minute; call it after changing the schema some
    /// other way than [`migrate`](Self::migrate).
    pub async fn learn_schema(&self) -> Result<bool, sqlx::Error> {
        self.deferred.learn(&self.side_pool).await
    }

    /// Closes the pools (at shutdown, after the last request).
    pub async fn close(&self) {
        self.pool.close().await;
        self.side_pool.close().await;
    }

    /// Connections checked out now.
    pub fn in_use(&self) -> usize {
        (self.pool.size() as usize).saturating_sub(self.pool.num_idle())
    }

    /// Connections idle in the pool now.
    pub fn idle(&self) -> usize {
        self.pool.num_idle()
    }

    /// Requests waiting for a connection now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Runs `body` in one transaction under `deadline`; commits or rolls back as its
    /// [`End`] says (orders-service's `place_order` is one, with `End::CommitVerified`).
    pub async fn transaction<T, B>(&self, deadline: &Deadline, body: B) -> Result<T, DbError>
    where
        T: Send + 'static,
        B: Statements<T>,
    {
        self.run(deadline, Access::ReadWrite, body).await
    }

    /// Runs `read` (statements that change nothing) in a read-only transaction under
    /// `deadline`, with the same server-side limits as any other statement.
    pub async fn read<T, F>(&self, deadline: &Deadline, read: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: Read<T>,
    {
        let body = statements(move |conn| {
            let read = read(conn);
            Box::pin(async move { read.await.map(End::Rollback) })
        });
        self.run(deadline, Access::ReadOnly, body).await
    }

    async fn run<T, B>(&self, deadline: &Deadline, access: Access, body: B) -> Result<T, DbError>
    where
        T: Send + 'static,
        B: Statements<T>,
    {
        if deadline.mode() == DeadlineMode::Observe {
            return self.observed(body, deadline).await;
        }
        if self.deferred.claim_refresh() {
            let (deferred, pool) = (self.deferred.clone(), self.side_pool.clone());
            tokio::spawn(async move {
                if let Err(err) = deferred.learn(&pool).await {
                    tracing::warn!(error = %err, "cannot read whether the schema defers work to COMMIT");
                }
            });
        }
        let handoff = Arc::new(Handoff::new());
        let job = Job {
            pool: self.pool.clone(),
            side_pool: self.side_pool.clone(),
            sessions: self.sessions.clone(),
            pending: self.pending.clone(),
            acquire_timeout: self.config.acquire_timeout,
            deadline: deadline.clone(),
            access,
            deferred: self.deferred.possible(),
            handoff: handoff.clone(),
            backend: OnceLock::new(),
            limit_sent: OnceLock::new(),
            cancel_unsettled: AtomicBool::new(false),
        };
        handoff::answer(job.run(body), handoff, deadline).await
    }
}

/// Gives a closure the higher-ranked signature of [`Statements`] (inferred from a
/// bound only where the closure is passed directly).
fn statements<T, F>(body: F) -> F
where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<End<T>, sqlx::Error>>,
{
    body
}
