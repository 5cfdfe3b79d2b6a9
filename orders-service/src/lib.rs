//! orders-service: the ingress of the demo, where a client's budget enters the system.
//!
//! A `POST /api/orders` spends its budget in named stages, each bounded by what is left:
//!
//! ```text
//! ingress ─▶ catalog_pool ─▶ catalog ─▶ db_pool ─▶ db (set timeouts, insert, decrement, commit)
//! ```
//!
//! With `ORDERS_PRECHECKS` set, each configured check (`{name}_pool ─▶ {name}`) runs
//! between the catalog and the database.
//!
//! # Module map
//!
//! - [`config`]: settings from the environment and `--flags`.
//! - [`mode`]: legacy, observe or propagate, switched at run time; [`budget`]: what a
//!   request may spend in it; [`legacy`]: the service without the technique.
//! - [`catalog`]: the catalog client: a [`BudgetedClient`](deadline_propagation::client::BudgetedClient)
//!   that looks up prices under the request's deadline.
//! - [`orders`]: validation and the order transaction (stock decrement and insert commit
//!   together; `Idempotency-Key` makes retries safe).
//! - [`prechecks`]: extra downstreams named by configuration (`ORDERS_PRECHECKS`) that
//!   each order must pass before it is written.
//! - [`assistant`]: tool calls for AI assistants under numeric budgets: the chat
//!   endpoint and the MCP server.
//! - [`routes`]: the HTTP API, health and readiness.
//! - [`admin`]: `GET|PUT /admin/mode` on the admin address: the rollout switch.
//!
//! `DEADLINE_MODE=legacy` runs the same handlers without the technique, for the
//! before/after experiment; `observe` runs it all but refuses nothing. The mode
//! switches at run time through the admin API.

pub mod admin;
pub mod assistant;
pub mod budget;
pub mod catalog;
pub mod config;
pub mod legacy;
pub mod mode;
pub mod orders;
pub mod prechecks;
pub mod routes;

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use deadline_propagation::Problem;
use deadline_propagation::db::{Db, DbConfig, DbError, Read, Statements};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::tools::ToolPolicy;
use service_kit::server::{ServerOptions, serve};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use budget::Budget;
pub use catalog::CatalogClient;
pub use config::Config;
use legacy::PlainDb;
pub use mode::{Mode, ModeSwitch};

/// What every handler shares.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The budgeted catalog client.
    pub catalog: CatalogClient,
    /// The configured prechecks (none by default).
    pub prechecks: prechecks::Prechecks,
    /// The database under the deadline.
    pub db: Db,
    /// The database as legacy mode reaches it: a plain pool.
    pub plain_db: PlainDb,
    /// This service's metrics.
    pub metrics: Metrics,
    /// Assistant budgets and planner.
    pub assistant: Assistant,
    /// The mode in force, switched by the admin API.
    pub mode: ModeSwitch,
}

impl AppState {
    /// Runs `body` in one transaction: under the deadline, or (legacy) on the plain
    /// pool.
    pub async fn transaction<T, B>(&self, budget: &Budget, body: B) -> Result<T, Problem>
    where
        T: Send + 'static,
        B: Statements<T>,
    {
        match budget {
            Budget::Deadline(deadline) => self
                .db
                .transaction(deadline, body)
                .await
                .map_err(unknown_sku_is_404),
            Budget::Unbounded => self.plain_db.transaction(body).await,
        }
    }

    /// Runs `read` (statements that change nothing): under the deadline, or (legacy)
    /// on the plain pool.
    pub async fn read<T, F>(&self, budget: &Budget, read: F) -> Result<T, Problem>
    where
        T: Send + 'static,
        F: Read<T>,
    {
        match budget {
            Budget::Deadline(deadline) => Ok(self.db.read(deadline, read).await?),
            Budget::Unbounded => self.plain_db.read(read).await,
        }
    }
}

/// A SKU the catalog knows but the inventory does not (foreign key violation) is the
/// client's mistake, not ours.
fn unknown_sku_is_404(err: DbError) -> Problem {
    match &err {
        DbError::Query(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23503") => {
            Problem::not_found("unknown sku: not in the inventory")
        }
        _ => err.into(),
    }
}

/// How assistant turns are planned and budgeted.
#[derive(Clone, Debug)]
pub struct Assistant {
    /// Turn, per-tool and call-count budgets.
    pub policy: ToolPolicy,
    /// Rules or an OpenAI-compatible model.
    pub planner: assistant::Planner,
}

impl Assistant {
    fn from_config(config: &Config) -> anyhow::Result<Self> {
        let planner = match &config.assistant_llm_url {
            None => assistant::Planner::Rules,
            Some(url) => assistant::Planner::OpenAi(assistant::planner::OpenAiPlanner {
                url: url.clone(),
                model: config.assistant_llm_model.clone(),
                api_key: config.assistant_llm_api_key.clone(),
                http: reqwest::Client::builder()
                    .pool_idle_timeout(assistant::planner::PLANNER_IDLE_TIMEOUT)
                    .build()
                    .context("cannot build the planner's HTTP client")?,
            }),
        };
        let mut policy = ToolPolicy::default();
        policy.turn = Config::ms(config.assistant_turn_budget_ms);
        policy.per_tool = Config::ms(config.assistant_tool_budget_ms);
        policy.max_calls = config.assistant_max_tool_calls;
        Ok(Self { policy, planner })
    }
}

/// A built, bound orders-service, not yet serving.
pub struct Application {
    listener: TcpListener,
    admin: TcpListener,
    port: u16,
    admin_port: u16,
    state: AppState,
    config: Config,
}

impl Application {
    /// Connects, migrates and binds (port 0 picks a free port, as tests do).
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let mut mode = None;
        let metrics =
            service_kit::metrics::for_service(SERVICE, config.runtime_metrics, |registry| {
                mode = Some(ModeSwitch::new(config.deadline_mode, SERVICE, registry));
            });
        let mode = mode.expect("the registry was built");
        // Every tool's series exist at 0 from the first scrape.
        metrics.declare_tools(assistant::Tool::ALL.map(assistant::Tool::name));
        // Before the database: a bad precheck setting fails start-up at once.
        let prechecks = prechecks::Prechecks::new(&config, &metrics)?;
        let mut db_config = DbConfig::default();
        db_config.max_connections = config.db_pool_max_connections;
        db_config.acquire_timeout = Config::ms(config.db_pool_acquire_timeout_ms);
        db_config.idle_in_transaction = Config::ms(config.db_idle_in_transaction_timeout_ms);
        db_config.liveness = Config::ms(config.db_liveness_timeout_ms);
        let db = Db::connect_lazy(&config.database_url, db_config)
            .context("DATABASE_URL is not a valid PostgreSQL URL")?
            .with_metrics(&metrics);
        let plain_db = PlainDb::connect_lazy(&config.database_url, &db_config)
            .context("DATABASE_URL is not a valid PostgreSQL URL")?;
        migrate(&db).await?;
        let catalog =
            CatalogClient::new(&config, &metrics).context("cannot build the catalog client")?;
        let listener = TcpListener::bind(config.listen_addr)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {} (ORDERS_LISTEN_ADDR)",
                    config.listen_addr
                )
            })?;
        let admin = TcpListener::bind(config.admin_addr)
            .await
            .with_context(|| {
                format!("cannot listen on {} (ORDERS_ADMIN_ADDR)", config.admin_addr)
            })?;
        Ok(Self {
            port: listener.local_addr()?.port(),
            admin_port: admin.local_addr()?.port(),
            listener,
            admin,
            state: AppState {
                catalog,
                prechecks,
                db,
                plain_db,
                metrics,
                assistant: Assistant::from_config(&config)?,
                mode,
            },
            config,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The admin API's port.
    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// The mode in force now.
    pub fn mode(&self) -> Mode {
        self.state.mode.get()
    }

    /// The shared state, for tests that look at pools and metrics.
    pub fn state(&self) -> AppState {
        self.state.clone()
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests. No request can
    /// legitimately need longer than the maximum budget, so that bounds the drain.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let options = ServerOptions {
            drain_timeout: service_kit::server::drain_timeout(Config::ms(
                self.config.deadline_max_ms,
            )),
            header_read_timeout: Config::ms(self.config.header_read_timeout_ms),
            ..ServerOptions::default()
        };
        // Open MCP event streams would hold the drain up: end them when shutdown starts.
        let stop = CancellationToken::new();
        let app = routes::router(&self.config, self.state.clone(), stop.clone());
        let admin = admin::router(self.state.mode.clone(), self.config.admin_allow_remote);
        let admin_stop = stop.clone();
        let shutdown = async move {
            shutdown.await;
            stop.cancel();
        };
        tokio::join!(
            serve(self.listener, app, shutdown, options),
            serve(self.admin, admin, admin_stop.cancelled_owned(), options),
        );
        self.state.db.close().await;
        self.state.plain_db.close().await;
    }
}

/// The `service` label of this service's metrics.
const SERVICE: &str = "orders-service";

/// The schema, embedded at compile time; public so that harnesses (`cargo xtask cost`)
/// build the very tables the service uses.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Applies the migrations, retrying briefly: under compose the database may still be
/// starting when this service does.
async fn migrate(db: &Db) -> anyhow::Result<()> {
    let mut attempt = 1;
    loop {
        match db.migrate(&MIGRATOR).await {
            Ok(()) => return Ok(()),
            Err(err) if attempt < 20 => {
                tracing::warn!(error = %err, attempt, "migrations failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                attempt += 1;
            }
            Err(err) => return Err(err).context("cannot apply migrations (DATABASE_URL)"),
        }
    }
}
