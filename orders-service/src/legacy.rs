//! The service without the technique: what `legacy` mode runs, the "before" of the
//! experiment. It is the code a team writes before it adopts deadline propagation:
//!
//! - HTTP: reqwest with a fixed 30 s timeout that covers the request but not the wait
//!   for a connection slot, and no budget header. The slot comes from the budgeted
//!   client's bulkhead, waited for without limit, so both paths share the downstream's
//!   connections and its pool gauges.
//! - PostgreSQL: a plain sqlx pool (sqlx's 30 s acquire timeout) and plain
//!   transactions, no `statement_timeout`. Its sessions carry the same server-side
//!   bounds for a silent network as the technique's: they bound the network, not the
//!   budget.

use std::time::Duration;

use bytes::Bytes;
use deadline_propagation::client::BudgetedClient;
use deadline_propagation::db::{DbConfig, DbError, End, Read, Statements};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::{DeadlineExceeded, Downstream, Problem, Stage};
use http::{Method, StatusCode};
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::time::Instant;

/// The fixed timeout of every step.
pub const LEGACY_TIMEOUT: Duration = Duration::from_secs(30);

/// How a call without a budget failed.
#[derive(Debug)]
pub enum Failure {
    /// The downstream answered this (not 2xx).
    Status(StatusCode),
    /// It could not be reached, or the fixed timeout passed.
    Transport(reqwest::Error),
}

/// Calls to one downstream without a budget.
#[derive(Clone, Debug)]
pub struct PlainClient {
    http: reqwest::Client,
    base_url: String,
    /// The budgeted client of the same downstream: its bulkhead's slots.
    pooled: BudgetedClient,
    metrics: Metrics,
}

impl PlainClient {
    /// A plain client beside `pooled`, sharing its slots and metrics.
    pub fn new(pooled: &BudgetedClient, metrics: &Metrics) -> Result<Self, reqwest::Error> {
        let config = pooled.config();
        let http = reqwest::Client::builder()
            .timeout(LEGACY_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(config.idle_timeout)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            http,
            base_url: config.base_url.clone(),
            pooled: pooled.clone(),
            metrics: metrics.clone(),
        })
    }

    /// The downstream this client calls.
    pub fn downstream(&self) -> Downstream {
        self.pooled.downstream()
    }

    /// `method base_url + path`, with `json` as the body; the whole body of a 2xx.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        json: Option<&serde_json::Value>,
    ) -> Result<Bytes, Failure> {
        let _slot = self.pooled.wait_for_slot().await;
        let started = Instant::now();
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base_url));
        if let Some(json) = json {
            request = request.json(json);
        }
        let sent = async {
            let response = request.send().await?;
            let status = response.status();
            Ok::<_, reqwest::Error>((status, response.bytes().await?))
        };
        let result = sent.await;
        let label = match &result {
            Ok((status, _)) => status.as_str().to_owned(),
            Err(err) if err.is_timeout() => "timeout".to_owned(),
            Err(_) => "error".to_owned(),
        };
        let name = self.downstream();
        self.metrics
            .observe_client_call(name, &label, started.elapsed());
        match result {
            Ok((status, body)) if status.is_success() => Ok(body),
            Ok((status, _)) => Err(Failure::Status(status)),
            Err(err) => Err(Failure::Transport(err)),
        }
    }
}

impl Failure {
    /// The answer for a failed call to `downstream`, as the contract spells it: 504
    /// for a timeout, 503 passed on, anything else 502.
    pub fn into_problem(self, downstream: Downstream, started: Instant) -> Problem {
        let stage = downstream.call();
        match self {
            Failure::Status(StatusCode::SERVICE_UNAVAILABLE) => Problem::overloaded(
                stage,
                Duration::from_secs(1),
                format!("the {stage} service is overloaded; retry later"),
            ),
            Failure::Status(StatusCode::GATEWAY_TIMEOUT) => timed_out(stage, started),
            Failure::Transport(err) if err.is_timeout() => timed_out(stage, started),
            Failure::Status(status) => Problem::bad_gateway(stage, format!("answered {status}")),
            Failure::Transport(err) => Problem::bad_gateway(stage, err),
        }
    }
}

fn timed_out(stage: Stage, started: Instant) -> Problem {
    Problem::deadline(DeadlineExceeded {
        stage,
        budget: LEGACY_TIMEOUT,
        elapsed: started.elapsed(),
    })
}

/// How long a legacy connection stays open unused.
const LEGACY_IDLE: Duration = Duration::from_secs(5);

/// A plain sqlx pool and plain transactions.
#[derive(Clone, Debug)]
pub struct PlainDb {
    pool: PgPool,
}

impl PlainDb {
    /// A lazily connecting pool of `config.max_connections`, its sessions carrying
    /// `config`'s bounds for a silent network. It sits beside `Db`'s pool, so its
    /// connections close after `LEGACY_IDLE` (5 s) unused: after a switch out of legacy the
    /// two pools do not hold twice the connections for long. No ping on the way out of
    /// the pool: a round trip per transaction the envelope does not pay would make the
    /// baseline dearer than plain code need be.
    pub fn connect_lazy(url: &str, config: &DbConfig) -> Result<Self, sqlx::Error> {
        let options: PgConnectOptions = url.parse()?;
        let bounds = config.session_bounds();
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(LEGACY_TIMEOUT)
            .idle_timeout(LEGACY_IDLE)
            .test_before_acquire(false)
            .connect_lazy_with(options.options(bounds));
        Ok(Self { pool })
    }

    /// Runs `body` in one transaction, committing or rolling back as it says.
    pub async fn transaction<T, B: Statements<T>>(&self, body: B) -> Result<T, Problem> {
        let started = Instant::now();
        let mut conn = self.pool.acquire().await.map_err(|e| problem(e, started))?;
        let mut tx = conn.begin().await.map_err(|e| problem(e, started))?;
        match body(&mut tx).await.map_err(|e| problem(e, started))? {
            End::Commit(value) | End::CommitVerified(value, _) => {
                tx.commit().await.map_err(Problem::internal)?;
                Ok(value)
            }
            End::Rollback(value) => Ok(value),
        }
    }

    /// Runs `read` in a transaction that it leaves as it found it.
    pub async fn read<T, F>(&self, read: F) -> Result<T, Problem>
    where
        T: Send + 'static,
        F: Read<T>,
    {
        self.transaction(move |conn| {
            let statements = read(conn);
            Box::pin(async move { statements.await.map(End::Rollback) })
        })
        .await
    }

    /// Closes the pool (at shutdown).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// What a failed statement answers without a budget: the server's own limits (a
/// `statement_timeout` someone set, an idle transaction the server ended) are 504 `db`;
/// a transaction the server ended over another (a serialization failure, a deadlock, a
/// lock not waited for) is the crate's 503 that wrote nothing, as in propagate: no
/// timer ran out; a database that cannot be reached is 503 `db_pool`; a foreign key
/// violation keeps its code for the caller to read.
pub fn problem(err: sqlx::Error, started: Instant) -> Problem {
    let code = match &err {
        sqlx::Error::Database(db) => db.code().map(String::from),
        _ => None,
    };
    match code.as_deref() {
        Some("57014" | "25P03") => return timed_out(Stage::Db, started),
        Some("40001" | "40P01" | "55P03") => return DbError::Conflict(err).into(),
        Some("57P01" | "57P02" | "57P03") => return Problem::unavailable(Stage::DbPool, err),
        Some("23503") => return Problem::not_found("unknown sku: not in the inventory"),
        _ => {}
    }
    match err {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => Problem::unavailable(Stage::DbPool, err),
        _ => Problem::internal(err),
    }
}
