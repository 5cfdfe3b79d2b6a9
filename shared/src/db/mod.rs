//! PostgreSQL under the deadline.
//!
//! # What an answer promises
//!
//! A 201 means the transaction committed; a 504, 503 or 502 means nothing was written,
//! so a client may retry even without an `Idempotency-Key`. gRPC makes no such promise
//! (its `DEADLINE_EXCEEDED` "may have succeeded"); this module earns it at the one
//! dangerous moment, COMMIT: once COMMIT is on the wire the server may commit whatever
//! the client does. So COMMIT is a point of no return: it is not started when too little
//! budget is left; the deferred work that COMMIT would run without any time limit is
//! fired just before it under the remaining time (`SET CONSTRAINTS ALL IMMEDIATE`,
//! sent only where the schema has deferrable constraints or constraint triggers); the
//! batch is cancelled at the deadline, which still aborts it until the commit record is
//! written; and its outcome is awaited (a little past the deadline at most,
//! 250 ms) and answered truthfully. Only an error the server reports in a
//! session that goes on proves a rollback; when the connection is lost instead, the
//! outcome is learned on another connection if the body gave an [`End::CommitVerified`]
//! check, and is otherwise a 500 that promises nothing, never a 504.
//!
//! # The only way to run SQL
//!
//! [`Db::transaction`] and [`Db::read`] are the whole API: there is no public pool, so a
//! handler cannot run a statement outside the budget. Each call:
//!
//! 1. `db_pool`: waits for a pooled connection for at most the remaining time and at
//!    most the pool's acquire timeout (the early-rejection threshold: a saturated or
//!    unreachable database is a quick 503, not a slow 504);
//! 2. `db`: sends `BEGIN`, with `SET statement_timeout` to what is left *after* that
//!    wait where the limit in force on the session does not fit it (`limit.rs`), in
//!    one round trip of utility statements (a connection's first transaction first
//!    learns which server process carries it, once); a budget that the wait used up
//!    starts no statement at all;
//! 3. runs the body's statements: the server stops a statement that waits on a lock or
//!    runs long at the deadline (SQLSTATE 57014, mapped to 504 `db`);
//! 4. commits or rolls back, as the body says.
//!
//! The limit is the session's, kept while it fits: a `SET LOCAL` in every transaction
//! was a few per cent of the database's CPU. The mode switches at run time and a
//! connection serves requests of every mode, so an observed transaction first resets a
//! session the technique may have touched. What a per-connection backstop would catch,
//! a transaction left open, cannot happen: the task that owns the connection closes
//! it, rather than return it, when the body panics or a statement will not end.
//!
//! # Why each transaction is a job that is never dropped halfway
//!
//! Dropping a sqlx future in the middle of a statement (the client hung up, an MCP
//! client cancelled, a client-side timeout fired) leaves the connection out of step
//! with the server: sqlx's on-release check then meets the cancelled statement's error
//! and closes the connection, one reconnect per cancel, exactly when the database is
//! busiest; and a drop during `BEGIN` can hand back a connection with a transaction
//! open. So the connection is owned by a job (`job.rs`) that never drops a statement:
//! when the caller goes away, or the deadline passes before the server's own limit has
//! fired, it cancels the statement on the server (`pg_cancel_backend` of the
//! connection's backend, learned once per connection, from a small side pool), again
//! until the statement comes back, keeps reading until its error arrives, rolls back
//! and returns the connection in step. The caller polls the job itself while it waits, so a
//! transaction that ends in time costs no task; the moment the caller stops waiting
//! (its answer came before the cleanup, its deadline passed, it went away), the job is
//! handed to a task of its own and finishes there. The caller gets its answer as soon
//! as that answer is known; the cleanup finishes after.
//!
//! The statements of one transaction share its deadline: the server-side limit is
//! per statement in PostgreSQL, so a later statement could run past the deadline on
//! its own limit; the task's cancel at the deadline is what ends it there.

mod backend;
mod error;
mod job;
mod limit;
mod observe;
pub(crate) mod schema;
pub(crate) mod sql;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Connection, migrate::Migrator};
use tracing::Instrument;

use crate::deadline::Deadline;
use crate::mode::DeadlineMode;

use backend::Backends;
pub use error::DbError;
pub(crate) use error::classify;
use job::{Handoff, Job};
use schema::DeferredWork;
use sql::Access;

/// What a transaction's body decides: commit or roll back, with the value to return.
///
/// ```
/// use deadline_propagation::db::End;
///
/// // Nothing to write after all: roll back, and still return the value.
/// let end: End<u32> = End::Rollback(0);
/// ```
#[derive(Debug)]
pub enum End<T> {
    /// Commit the transaction, then return the value (if the commit succeeds). Should
    /// the connection be lost once COMMIT is sent, the answer is
    /// [`DbError::OutcomeUnknown`].
    Commit(T),
    /// Commit, and should the connection be lost once COMMIT is sent, learn whether it
    /// committed by running the [`Check`] on another connection (within
    /// 250 ms past the deadline) instead of answering that the outcome is
    /// unknown.
    CommitVerified(T, Check),
    /// Roll the transaction back and return the value (a read, or nothing to write).
    Rollback(T),
}

/// A read that tells whether a transaction committed (`true`), for a COMMIT whose
/// connection was lost: typically "does the row I inserted exist", by a key the body
/// knows. It runs only once the transaction has ended on the server.
///
/// ```
/// use deadline_propagation::db::{Check, End};
///
/// let id: i64 = 42; // returned by the body's INSERT
/// let check = Check::new(move |conn| {
///     Box::pin(
///         sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1)")
///             .bind(id)
///             .fetch_one(conn),
///     )
/// });
/// let end = End::CommitVerified(id, check);
/// ```
pub struct Check(Box<dyn CheckFn>);

trait CheckFn:
    for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<bool, sqlx::Error>> + Send
{
}

impl<F> CheckFn for F where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<bool, sqlx::Error>> + Send
{
}

impl Check {
    /// The check `read`: `true` when the transaction's writes are in the table.
    pub fn new<F>(read: F) -> Self
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<bool, sqlx::Error>>
            + Send
            + 'static,
    {
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

/// The statements of a transaction on its connection, as one future, ending in what to
/// do ([`End`]).
///
/// Write it as `|conn| Box::pin(async move { ... })`, with queries run on `&mut *conn`.
/// It must only run SQL: the task that runs it cancels the statement in flight, and
/// only that, when the deadline passes or the caller goes away; and the server ends a
/// transaction left waiting between statements (see [`DbConfig`]).
///
/// See [`Db::transaction`] for one.
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

/// The statements of a read ([`Db::read`]): a future on the connection that gives the
/// value read. Written like [`Statements`], without the [`End`].
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

/// Pool settings, and the bounds the server keeps on each session by itself: the
/// defaults, which fields may change.
///
/// ```
/// use std::time::Duration;
/// use deadline_propagation::db::DbConfig;
///
/// let mut config = DbConfig::default();
/// config.max_connections = 10;
/// config.acquire_timeout = Duration::from_millis(250); // then 503 `db_pool`
/// ```
///
/// # When the network goes silent
///
/// A statement's `statement_timeout` and the cancel at the deadline reach the server
/// only while the network does. When the link to the database is cut (packets dropped,
/// no reset), neither arrives, and a transaction whose statement has finished sits
/// `idle in transaction` on the server holding its row locks, for as long as the
/// server's TCP stack takes to give up on the client: minutes by default, and after a
/// partition longer than the client's own retries it survives the heal. So every
/// session of the pool is opened with bounds the server applies by itself, as startup
/// options (they travel in the connection's first packet: no statement, no round trip,
/// and they hold in every mode, since a session serves requests of all of them):
///
/// - `idle_in_transaction_session_timeout` = [`idle_in_transaction`](Self::idle_in_transaction):
///   a transaction waiting that long for its client's next statement has lost its
///   client (a body runs only SQL, so a live one waits a round trip at most); the
///   server ends the session and the transaction rolls back.
/// - `tcp_user_timeout` = [`liveness`](Self::liveness), with TCP keepalives every
///   second and `client_connection_check_interval` at a quarter of it: a session whose
///   client stops acknowledging (an answer sent into a cut link, keepalives unanswered)
///   is closed by the server's kernel, and a statement still running notices it and
///   stops. This bounds the statements of `observe` too, which carry no
///   `statement_timeout`.
///
/// Measured on a partitioned loopback link: a ghost transaction
/// ended 0.5 s after its statement finished, a running statement whose client was cut
/// off about 2 s after its client's last packet. Zero switches a bound off.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct DbConfig {
    /// Pool size.
    pub max_connections: u32,
    /// The longest a request waits for a connection: then 503 `db_pool`.
    pub acquire_timeout: Duration,
    /// How long the server lets a transaction wait for its client's next statement.
    pub idle_in_transaction: Duration,
    /// How long the server waits for a silent client's TCP connection before it closes
    /// the session (`tcp_user_timeout`, keepalives, the connection check).
    pub liveness: Duration,
}

impl Default for DbConfig {
    /// 10 connections, a 250 ms acquire timeout, 500 ms idle in a transaction, 1 s of
    /// liveness.
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
    /// The startup options that carry [`idle_in_transaction`](Self::idle_in_transaction)
    /// and [`liveness`](Self::liveness) to the server.
    pub fn session_bounds(&self) -> Vec<(&'static str, u128)> {
        let mut bounds = Vec::new();
        let idle = self.idle_in_transaction.as_millis();
        if idle > 0 {
            bounds.push(("idle_in_transaction_session_timeout", idle));
        }
        let liveness = self.liveness.as_millis();
        if liveness > 0 {
            // Keepalives count whole seconds, one at the least; with a user timeout
            // set, the kernel gives up once probes go unanswered that long.
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

/// How long a pooled connection may sit idle before it is pinged on its way out of the
/// pool. sqlx pings every connection it hands out by default: a round trip per
/// transaction, on both sides, for a connection that was in use a millisecond ago (and a
/// timer armed for the wait, which wakes the runtime's driver). pgx's pool pings only
/// connections idle for more than a second, and so does this one: a busy service pays
/// nothing, and a connection that sat through a server restart is still found dead and
/// replaced before a transaction meets it. (A connection that dies within the second is
/// met by its transaction's first statement: a 503 that wrote nothing.)
///
/// A connection that a transaction takes idle from the pool, without sqlx's wait, is
/// checked the same way by its job (`job.rs`, `take_idle`).
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// The `application_name` of the side pool's sessions (cancels, outcome checks).
const SIDE_SESSION: &str = "deadline-side";

/// The pool plus the mode it runs in. Cheap to clone.
///
/// ```no_run
/// use std::time::Duration;
/// use deadline_propagation::db::{Db, DbConfig};
/// use deadline_propagation::Deadline;
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = DbConfig::default();
/// let db = Db::connect_lazy("postgres://app@127.0.0.1/app", config)?;
/// let deadline = Deadline::after(Duration::from_millis(300));
/// // Pool wait, BEGIN with statement_timeout = what is left, the query, ROLLBACK.
/// let one: i32 = db
///     .read(&deadline, |conn| Box::pin(sqlx::query_scalar("SELECT 1").fetch_one(conn)))
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
    /// Sends cancels and learns outcomes; separate so a saturated main pool cannot
    /// block it.
    side_pool: PgPool,
    /// The backend of each connection, for cancels.
    backends: Arc<Backends>,
    /// Whether the schema can leave work to COMMIT.
    deferred: Arc<DeferredWork>,
    /// The plain connection settings, for migrations (no per-session limits).
    options: PgConnectOptions,
    config: DbConfig,
    /// Requests waiting for a connection now.
    pending: Arc<AtomicUsize>,
}

impl Db {
    /// A lazily connecting pool: the service starts even while the database is down,
    /// and answers 503 until it is back.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use deadline_propagation::db::{Db, DbConfig};
    ///
    /// # #[tokio::main] async fn main() -> Result<(), sqlx::Error> {
    /// let config = DbConfig::default();
    /// // Nothing is connected yet: a database that is down is a 503 per request, not a crash.
    /// let db = Db::connect_lazy("postgres://app@127.0.0.1/app", config)?;
    /// # Ok(()) }
    /// ```
    pub fn connect_lazy(url: &str, config: DbConfig) -> Result<Self, sqlx::Error> {
        let options: PgConnectOptions = url.parse()?;
        // No deadline limit in the startup options: the mode can switch at run time,
        // and a connection outlives many requests of either mode. A propagate
        // transaction sets the session's limit where the one in force does not fit
        // (`limit.rs`); observe resets it, as code without the technique would run.
        // What every session carries are the bounds for a silent network (see
        // `DbConfig`), the same in every mode. The pool's own acquire limit stays
        // sqlx's: propagate bounds each acquire by `min(acquire_timeout, remaining)`,
        // observe by sqlx's own 30 s.
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
            .connect_lazy_with(options.clone().application_name(SIDE_SESSION));
        Ok(Self {
            pool,
            side_pool,
            backends: Arc::new(Backends::new(config.max_connections)),
            deferred: Arc::default(),
            options,
            config,
            pending: Arc::default(),
        })
    }

    /// Applies `migrator` on a connection of its own, outside the per-request limits
    /// (a migration may legitimately take longer than any request).
    ///
    /// The schema is read again afterwards (see [`learn_schema`](Self::learn_schema)).
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

    /// Reads from the catalog tables whether the schema can leave work to COMMIT
    /// (deferrable constraints or constraint triggers) and returns it. Only then does a
    /// COMMIT carry the statements that fire that work under the remaining time; a
    /// schema without it commits with a bare `COMMIT`.
    ///
    /// The pool reads the schema by itself when it first serves a transaction, after
    /// [`migrate`](Self::migrate), and again once a minute; call this after changing
    /// the schema some other way (until then, the cancel at the deadline still bounds
    /// deferred work).
    pub async fn learn_schema(&self) -> Result<bool, sqlx::Error> {
        self.deferred.learn(&self.side_pool).await
    }

    /// Starts a reading of the schema in the background when the last one is missing
    /// or old, so no request waits for it.
    fn refresh_schema(&self) {
        if !self.deferred.stale() {
            return;
        }
        let Some(reading) = self.deferred.claim_reading() else {
            return;
        };
        let pool = self.side_pool.clone();
        tokio::spawn(async move {
            if let Err(err) = reading.learn(&pool).await {
                tracing::warn!(error = %err, "cannot read whether the schema defers work to COMMIT");
            }
        });
    }

    /// Closes the pools (at shutdown, after the last request).
    pub async fn close(&self) {
        self.pool.close().await;
        self.side_pool.close().await;
    }

    /// Connections checked out right now.
    pub fn in_use(&self) -> usize {
        (self.pool.size() as usize).saturating_sub(self.pool.num_idle())
    }

    /// Connections idle in the pool right now.
    pub fn idle(&self) -> usize {
        self.pool.num_idle()
    }

    /// Requests waiting for a connection right now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Runs `body` in one read-write transaction under `deadline`; commits or rolls back
    /// as the body's [`End`] says.
    ///
    /// ```no_run
    /// use deadline_propagation::db::End;
    ///
    /// # async fn example(db: deadline_propagation::db::Db, deadline: deadline_propagation::Deadline) -> Result<(), deadline_propagation::Problem> {
    /// // The stock change and the order commit together, or not at all.
    /// let taken: bool = db
    ///     .transaction(&deadline, |conn| {
    ///         Box::pin(async move {
    ///             let updated = sqlx::query(
    ///                 "UPDATE inventory SET available = available - 1 WHERE sku = $1 AND available >= 1",
    ///             )
    ///             .bind("SKU-00001")
    ///             .execute(&mut *conn)
    ///             .await?;
    ///             if updated.rows_affected() == 0 {
    ///                 return Ok(End::Rollback(false));
    ///             }
    ///             Ok(End::Commit(true))
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn transaction<T, B>(&self, deadline: &Deadline, body: B) -> Result<T, DbError>
    where
        T: Send + 'static,
        B: Statements<T>,
    {
        self.spawn(deadline, Access::ReadWrite, body).await
    }

    /// Runs `read` (statements that change nothing) in a read-only transaction under
    /// `deadline`, so it gets the same server-side limits as any other statement.
    ///
    /// ```no_run
    /// # async fn example(db: deadline_propagation::db::Db, deadline: deadline_propagation::Deadline) -> Result<(), deadline_propagation::Problem> {
    /// let available: Option<i32> = db
    ///     .read(&deadline, |conn| {
    ///         Box::pin(
    ///             sqlx::query_scalar("SELECT available FROM inventory WHERE sku = $1")
    ///                 .bind("SKU-00042")
    ///                 .fetch_optional(conn),
    ///         )
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn read<T, F>(&self, deadline: &Deadline, read: F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: Read<T>,
    {
        let body = body(move |conn| {
            let statements = read(conn);
            Box::pin(async move { statements.await.map(End::Rollback) })
        });
        self.spawn(deadline, Access::ReadOnly, body).await
    }

    async fn spawn<T, B>(&self, deadline: &Deadline, access: Access, body: B) -> Result<T, DbError>
    where
        T: Send + 'static,
        B: Statements<T>,
    {
        match deadline.mode() {
            DeadlineMode::Observe => return self.observed(body, deadline).await,
            DeadlineMode::Propagate => {}
        }
        self.refresh_schema();
        let handoff = Arc::new(Handoff::new());
        let job = Job {
            pool: self.pool.clone(),
            side_pool: self.side_pool.clone(),
            pending: self.pending.clone(),
            acquire_timeout: self.config.acquire_timeout,
            deadline: deadline.clone(),
            access,
            backends: self.backends.clone(),
            backend: OnceLock::new(),
            limit_sent: OnceLock::new(),
            deferred: self.deferred.possible(),
            cancel_unsettled: AtomicBool::new(false),
            handoff: handoff.clone(),
        };
        // The job runs inside this future while the caller waits for it: no task and no
        // wake-up of another worker on the happy path. Should this future end (an answer
        // came before the cleanup, the deadline, a caller gone), the job is handed to a
        // task of its own and finishes there; if the caller has not answered (client
        // gone, tool cancelled), the job stops its statement on the server and cleans up
        // by itself, answering nobody.
        let mut job = Detach::new(job.run(body).in_current_span(), handoff.clone());
        // The job answers as soon as it knows. At the deadline, if it has not, the caller
        // answers 504 itself, at once, naming the stage the job is in: the job may be
        // waiting on a server the network has cut off, and nothing it could still learn
        // would change that answer, since no COMMIT has been sent. (Once the job has
        // claimed the answer, a COMMIT is on its way and only the job can tell its
        // outcome: then the caller waits for it, within the COMMIT's grace.)
        tokio::select! {
            biased;
            result = answer_of(&mut job, &handoff) => return result,
            () = tokio::time::sleep_until(deadline.instant()) => {}
        }
        // This timer is the job's deadline too: the job cancels its statement on its next
        // poll, here below or on a task of its own once this future ends (`Detach`).
        handoff.stop();
        if handoff.claim() {
            handoff.record_db(deadline);
            return Err(deadline.exceeded(handoff.stage()).into());
        }
        // The job always answers once it has claimed; no answer means it panicked.
        answer_of(&mut job, &handoff).await
    }
}

/// The job's answer, read as the job runs inside the caller's future: the job is polled
/// here, so its answer can only arrive during that poll, and is read right after it.
/// Nothing waits on the answer itself: a waker left there would be this very task's,
/// woken by the job's answer while the task runs; tokio queues a task woken during its
/// own poll again, and may wake another worker to run it, for nothing (a futex and two
/// context switches per order, measured with `perf`'s scheduler events).
fn answer_of<'a, T>(
    job: &'a mut Detach<T>,
    handoff: &'a Handoff<T>,
) -> impl Future<Output = Result<T, DbError>> + 'a {
    std::future::poll_fn(move |cx| {
        let ended = Pin::new(&mut *job).poll(cx).is_ready();
        match handoff.take_answer() {
            Some(result) => Poll::Ready(result),
            None if !ended => Poll::Pending,
            // A job that ended without answering panicked.
            None => Poll::Ready(crashed()),
        }
    })
}

/// What the caller answers when its job ended without an answer (it panicked).
fn crashed<T>() -> Result<T, DbError> {
    Err(DbError::Query(sqlx::Error::WorkerCrashed))
}

/// A job polled by its caller, and handed to a task of its own if the caller stops
/// polling it before it ends: a transaction is never dropped halfway (the reason it
/// owns its connection), yet a transaction that ends while its caller waits costs no
/// task. Why it matters: a spawned task is queued where another worker may steal it,
/// so each spawn may wake a parked worker (a futex and two context switches); on the
/// happy path that was most of the technique's cost in orders-service's own CPU.
///
/// Dropped with the caller's future, it first claims the answer (nobody is left to
/// read one, and a request that was not answered is not counted) and stops the job,
/// then hands the job on: the stop is set before anyone else can poll the job, so the
/// job reads it on its next poll and needs no waker for it (see `Handoff::stopped`).
struct Detach<T> {
    job: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    handoff: Arc<Handoff<T>>,
}

impl<T> Detach<T> {
    fn new(job: impl Future<Output = ()> + Send + 'static, handoff: Arc<Handoff<T>>) -> Self {
        Self {
            job: Some(Box::pin(job)),
            handoff,
        }
    }
}

impl<T> Future for Detach<T> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(job) = self.job.as_mut() else {
            return Poll::Ready(());
        };
        ready!(job.as_mut().poll(cx));
        self.job = None;
        Poll::Ready(())
    }
}

impl<T> Drop for Detach<T> {
    fn drop(&mut self) {
        self.handoff.claim();
        self.handoff.stop();
        let Some(job) = self.job.take() else { return };
        // A job that panicked is not polled again; outside a runtime (one shutting
        // down) there is nowhere to finish it, and dropping it closes its connection.
        if std::thread::panicking() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn(job));
        }
    }
}

/// Gives a closure the higher-ranked signature of [`Statements`] (closure signatures are
/// inferred from a bound only where the closure is passed directly).
fn body<T, F>(body: F) -> F
where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<End<T>, sqlx::Error>>,
{
    body
}
