//! PostgreSQL under the deadline (DESIGN §5).
//!
//! Two stages:
//! - `db_pool`: [`Db::begin`] waits for a pooled connection for at most the remaining
//!   time, and at most the pool's own acquire timeout (the early-rejection threshold:
//!   a saturated or unreachable database is a quick 503, not a slow 504).
//! - `db`: statements. Dropping a sqlx future does **not** stop the statement on the
//!   server: sqlx sends no CancelRequest, and the connection stays checked out until
//!   the server has finished (DESIGN §10). So before the first statement each
//!   transaction sets `statement_timeout` and `lock_timeout` to the remaining time, with
//!   `set_config(name, value, true)` (`SET LOCAL` takes no bind parameter). The server
//!   then cancels a statement that waits on a lock or runs long (SQLSTATE 55P03 or
//!   57014, mapped to 504 `db`), the transaction rolls back, and the connection goes
//!   back to the pool clean.
//!
//! The server-side limits are a few milliseconds *shorter* than the client-side bound,
//! so the server usually cancels first and the error arrives on a connection that is
//! immediately usable; the client-side bound stays as the backstop.

use std::future::IntoFuture;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
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
}

/// The pool plus the mode it runs in. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
    mode: DeadlineMode,
    metrics: Option<DbMetrics>,
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
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(acquire_timeout)
            .connect_lazy(url)?;
        Ok(Self::from_pool(pool, config.mode, metrics))
    }

    /// Wraps an existing pool.
    pub fn from_pool(pool: PgPool, mode: DeadlineMode, metrics: Option<DbMetrics>) -> Self {
        Self {
            pool,
            mode,
            metrics,
        }
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

    /// Stage `db_pool`, then `db`: a connection, `BEGIN`, and the server-side timeouts.
    pub async fn begin(
        &self,
        deadline: &Deadline,
    ) -> Result<Transaction<'static, Postgres>, DbError> {
        let mut tx = self.checkout(deadline).await?;
        if self.mode == DeadlineMode::Propagate {
            self.set_server_timeouts(deadline, &mut tx).await?;
        }
        Ok(tx)
    }

    /// Stage `db`: one step (statements, a commit) under what is left of the budget.
    pub async fn run<T, F>(&self, deadline: &Deadline, step: F) -> Result<T, DbError>
    where
        F: IntoFuture<Output = Result<T, sqlx::Error>>,
    {
        let result = match self.mode {
            DeadlineMode::Legacy => step.into_future().await,
            DeadlineMode::Propagate => deadline.run(Stage::Db, step).await?,
        };
        result.map_err(|err| classify(err, deadline, Stage::Db))
    }

    /// Waits for a connection and begins a transaction (stage `db_pool`).
    async fn checkout(
        &self,
        deadline: &Deadline,
    ) -> Result<Transaction<'static, Postgres>, DbError> {
        let _waiting = self.metrics.as_ref().map(Pending::enter);
        let result = match self.mode {
            DeadlineMode::Legacy => self.pool.begin().await,
            DeadlineMode::Propagate => deadline.run(Stage::DbPool, self.pool.begin()).await?,
        };
        result.map_err(|err| classify(err, deadline, Stage::DbPool))
    }

    /// `statement_timeout` and `lock_timeout` for this transaction only.
    async fn set_server_timeouts(
        &self,
        deadline: &Deadline,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<(), DbError> {
        let left = deadline
            .remaining()
            .saturating_sub(SERVER_MARGIN)
            .as_millis()
            .max(1);
        let left = left.to_string();
        self.run(
            deadline,
            sqlx::query(
                "SELECT set_config('statement_timeout', $1, true), \
                        set_config('lock_timeout', $1, true), \
                        set_config('idle_in_transaction_session_timeout', $1, true)",
            )
            .bind(&left)
            .execute(&mut **tx),
        )
        .await
        .map(drop)
    }
}

/// Maps a sqlx error to what the caller should answer.
pub fn classify(err: sqlx::Error, deadline: &Deadline, stage: Stage) -> DbError {
    match &err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // query_canceled (statement_timeout) and lock_not_available (lock_timeout):
            // the server stopped waiting because our budget ran out.
            Some("57014" | "55P03") => DbError::Deadline(deadline.exceeded(Stage::Db)),
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
