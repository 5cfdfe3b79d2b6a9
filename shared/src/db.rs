//! PostgreSQL under the deadline (DESIGN §5).
//!
//! Two stages:
//! - `db_pool`: [`Db::begin`] waits for a pooled connection for at most the remaining
//!   time, and at most the pool's own acquire timeout (the early-rejection threshold:
//!   a saturated or unreachable database is a quick 503, not a slow 504).
//! - `db`: statements. Dropping a sqlx future does **not** stop the statement on the
//!   server: sqlx sends no CancelRequest, and the connection stays checked out until
//!   the server has finished (DESIGN §10). So each transaction sets
//!   `statement_timeout` and `lock_timeout` to the remaining time with
//!   `set_config(name, value, true)` (a `SET LOCAL`), in the same round trip as its
//!   `BEGIN` rather than as a separate query. The server then cancels a statement that
//!   waits on a lock or runs long (SQLSTATE 55P03 or 57014, mapped to 504 `db`), the
//!   transaction rolls back, and the connection goes back to the pool clean.
//!
//! The server-side limits are a few milliseconds *shorter* than the client-side bound,
//! so the server usually cancels first and the error arrives on a connection that is
//! immediately usable; the client-side bound stays as the backstop.
//!
//! Work can also be abandoned before the deadline: the client goes away, or an MCP
//! client cancels a tool call. Then waiting for `statement_timeout` would keep the
//! statement (and its locks and connection) busy for the rest of the budget, so
//! [`Db::run_cancellable`] asks the server to cancel it at once with
//! `pg_cancel_backend`, sent from a small side pool that regular traffic cannot
//! exhaust. The transaction is found by a unique `application_name` it sets the same
//! way: it reverts at commit or rollback, so the cancel can never hit a later
//! transaction on the same pooled connection.

use std::future::IntoFuture;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::ingress::DeadlineMode;
use crate::metrics::DbMetrics;
use crate::problem::Problem;
use crate::stage::Stage;

/// How much earlier than the deadline the server is told to give up. `lock_timeout` and
/// `statement_timeout` count from the start of each statement, which comes a round trip
/// or two after they are set; the margin covers that, so the server still stops waiting
/// before the client-side deadline fires.
const SERVER_MARGIN: Duration = Duration::from_millis(10);

/// How much longer than the largest budget an idle transaction may live (see
/// `Db::connect_lazy`).
const IDLE_IN_TRANSACTION_SLACK: Duration = Duration::from_secs(1);

/// A failed database step.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The budget ran out (client-side bound or server-side cancel): 504.
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
    /// The database is unreachable or the pool is saturated: 503.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Anything else: a bug or a constraint we did not expect: 500.
    #[error("database error: {0}")]
    Query(#[source] sqlx::Error),
}

impl From<DbError> for Problem {
    fn from(err: DbError) -> Self {
        match err {
            DbError::Deadline(exceeded) => Problem::deadline(exceeded),
            DbError::Unavailable(cause) => Problem::unavailable(Stage::DbPool, cause),
            DbError::Query(err) => Problem::internal(err),
        }
    }
}

/// Pool settings.
#[derive(Clone, Copy, Debug)]
pub struct DbConfig {
    /// Pool size (`DB_POOL_MAX_CONNECTIONS`).
    pub max_connections: u32,
    /// The longest a request waits for a connection (`DB_POOL_ACQUIRE_TIMEOUT_MS`).
    pub acquire_timeout: Duration,
    /// Propagate or legacy.
    pub mode: DeadlineMode,
    /// The largest budget any request gets (`DEADLINE_MAX_MS`): no transaction may
    /// legitimately stay open longer.
    pub max_budget: Duration,
}

/// The pool plus the mode it runs in. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
    /// Sends `pg_cancel_backend`; separate so a saturated main pool cannot block it.
    cancel_pool: PgPool,
    mode: DeadlineMode,
    metrics: Option<DbMetrics>,
}

/// A transaction under a deadline. Derefs to the connection, so queries take `&mut *tx`.
#[derive(Debug)]
pub struct Tx {
    inner: Transaction<'static, Postgres>,
    backend: Option<Backend>,
}

/// Names one transaction on the server: its `application_name`, unique per transaction
/// and reverted when it ends, so a cancel finds exactly this transaction's statement
/// and never a later one on the same (pooled) connection.
#[derive(Debug, Clone)]
pub struct Backend {
    tag: String,
}

impl Backend {
    /// A process-wide unique tag (within `NAMEDATALEN`).
    fn next() -> Self {
        use std::hash::{BuildHasher, Hasher};
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NONCE: OnceLock<u64> = OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nonce = *NONCE.get_or_init(|| {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        });
        Self {
            tag: format!(
                "deadline-{nonce:016x}-{}",
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }
}

impl Tx {
    /// The transaction's name on the server (in propagate mode), for
    /// [`Db::run_cancellable`].
    pub fn backend(&self) -> Option<Backend> {
        self.backend.clone()
    }

    /// The commit, as a step for [`Db::run`].
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.inner.commit().await
    }
}

impl Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.inner
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.inner
    }
}

impl Db {
    /// A lazily connecting pool: the service starts even while the database is down,
    /// and answers 503 until it is back.
    pub fn connect_lazy(
        url: &str,
        config: DbConfig,
        metrics: Option<DbMetrics>,
    ) -> Result<Self, sqlx::Error> {
        let acquire_timeout = match config.mode {
            DeadlineMode::Propagate => config.acquire_timeout,
            DeadlineMode::Legacy => DeadlineMode::LEGACY_TIMEOUT,
        };
        let options: PgConnectOptions = url.parse()?;
        let pool_options = match config.mode {
            // A safety net against a transaction left open by a bug, set once per
            // connection in its startup packet (no per-request cost). It terminates the
            // whole session, so it is a second longer than any budget can be.
            DeadlineMode::Propagate => options.clone().options([(
                "idle_in_transaction_session_timeout",
                (config.max_budget + IDLE_IN_TRANSACTION_SLACK)
                    .as_millis()
                    .to_string(),
            )]),
            DeadlineMode::Legacy => options.clone(),
        };
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(acquire_timeout)
            .connect_lazy_with(pool_options);
        let cancel_pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            cancel_pool,
            mode: config.mode,
            metrics,
        })
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Connections checked out right now.
    pub fn in_use(&self) -> usize {
        (self.pool.size() as usize).saturating_sub(self.pool.num_idle())
    }

    /// Copies the pool's idle and in-use counts into the gauges.
    pub fn report_pool(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.set_connections(self.pool.num_idle(), self.in_use());
        }
    }

    /// Stage `db_pool`: a connection, then `BEGIN` with the server-side timeouts in the
    /// same round trip.
    pub async fn begin(&self, deadline: &Deadline) -> Result<Tx, DbError> {
        let _waiting = self.metrics.as_ref().map(Pending::enter);
        let (result, backend) = match self.mode {
            DeadlineMode::Legacy => (self.pool.begin().await, None),
            DeadlineMode::Propagate => {
                let backend = Backend::next();
                let begin = begin_statement(deadline, &backend);
                let begun = deadline
                    .run(Stage::DbPool, self.pool.begin_with(begin))
                    .await?;
                (begun, Some(backend))
            }
        };
        let inner = result.map_err(|err| classify(err, deadline, Stage::DbPool))?;
        Ok(Tx { inner, backend })
    }

    /// Stage `db`: one step (statements, a commit) under what is left of the budget.
    pub async fn run<T, F>(&self, deadline: &Deadline, step: F) -> Result<T, DbError>
    where
        F: IntoFuture<Output = Result<T, sqlx::Error>>,
    {
        self.run_cancellable(deadline, None, step).await
    }

    /// Like [`run`](Self::run), for a statement of the transaction running on `backend`
    /// ([`Tx::backend`]): if this future is dropped before the
    /// statement finishes (deadline, client gone, tool cancelled), the server is told to
    /// cancel it at once instead of running on until `statement_timeout`.
    pub async fn run_cancellable<T, F>(
        &self,
        deadline: &Deadline,
        backend: Option<Backend>,
        step: F,
    ) -> Result<T, DbError>
    where
        F: IntoFuture<Output = Result<T, sqlx::Error>>,
    {
        let mut guard = CancelOnDrop {
            pool: &self.cancel_pool,
            backend,
        };
        let result = match self.mode {
            DeadlineMode::Legacy => Ok(step.into_future().await),
            DeadlineMode::Propagate => deadline.run(Stage::Db, step).await,
        };
        // The statement has finished (or the server cancelled it): nothing to cancel.
        // Only when the client-side deadline dropped it may it still be running.
        if result.is_ok() {
            guard.backend = None;
        }
        result?.map_err(|err| classify(err, deadline, Stage::Db))
    }
}

/// `BEGIN` plus this transaction's server-side limits, sent as one simple query.
///
/// `set_config(name, value, true)` is `SET LOCAL`: it ends with the transaction. One
/// `SELECT` setting all three costs the server less than three `SET LOCAL`s. There are
/// no bind parameters in a simple query; the values are integers and the tag is ours,
/// so formatting them in is safe. The limits are computed before the pool wait, so
/// under pool contention they may run past the deadline by that wait (at most the
/// acquire timeout); the client-side deadline and the cancel on drop still stop the
/// statement at the deadline.
fn begin_statement(deadline: &Deadline, backend: &Backend) -> sqlx::AssertSqlSafe<String> {
    let left = deadline
        .remaining()
        .saturating_sub(SERVER_MARGIN)
        .max(Duration::from_millis(1))
        .as_millis();
    sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT set_config('statement_timeout', '{left}', true), \
         set_config('lock_timeout', '{left}', true), \
         set_config('application_name', '{}', true)",
        backend.tag
    ))
}

/// Maps a sqlx error to what the caller should answer.
pub fn classify(err: sqlx::Error, deadline: &Deadline, stage: Stage) -> DbError {
    match &err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // query_canceled (statement_timeout) and lock_not_available (lock_timeout):
            // the server stopped waiting because our budget ran out.
            // idle_in_transaction_session_timeout (25P03) means the same, later.
            Some("57014" | "55P03" | "25P03") => DbError::Deadline(deadline.exceeded(Stage::Db)),
            // admin_shutdown, crash_shutdown, cannot_connect_now: the server is going away.
            Some("57P01" | "57P02" | "57P03") => DbError::Unavailable(err.to_string()),
            _ => DbError::Query(err),
        },
        sqlx::Error::PoolTimedOut if deadline.is_expired() => {
            DbError::Deadline(deadline.exceeded(stage))
        }
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_) => DbError::Unavailable(err.to_string()),
        sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => {
            DbError::Unavailable(err.to_string())
        }
        _ => DbError::Query(err),
    }
}

/// Cancels the statement of `backend` on the server when dropped while armed.
struct CancelOnDrop<'a> {
    pool: &'a PgPool,
    backend: Option<Backend>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let Some(Backend { tag }) = self.backend.take() else {
            return;
        };
        let pool = self.pool.clone();
        // Drop cannot await: the cancel goes out on its own task. If the runtime is
        // shutting down there is no task to run; statement_timeout still ends it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // Only while our transaction is still open: the tag reverts when it
                // ends, so a connection already back in the pool is never touched.
                let sent = sqlx::query(
                    "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(&tag)
                .execute(&pool)
                .await;
                if let Err(err) = sent {
                    tracing::warn!(tag, error = %err, "pg_cancel_backend failed");
                }
            });
        }
    }
}

/// Counts a request waiting for a connection, also when its future is dropped.
struct Pending(prometheus_client::metrics::gauge::Gauge);

impl Pending {
    fn enter(metrics: &DbMetrics) -> Self {
        let gauge = metrics.pending().clone();
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.dec();
    }
}
