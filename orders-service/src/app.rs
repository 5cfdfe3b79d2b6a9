//! [`Application`]: orders-service built from its [`Config`], bound (port 0 picks a
//! free port, as tests do) and served until a shutdown.

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use deadline_propagation::db::{Db, DbConfig};
use service_kit::server::{ServerOptions, serve};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::assistant::planner::Assistant;
use crate::catalog::CatalogClient;
use crate::config::{Config, Mode};
use crate::health::{self, Health};
use crate::legacy::PlainDb;
use crate::mode::ModeSwitch;
use crate::prechecks::Prechecks;
use crate::shipments::Shipments;
use crate::state::AppState;
use crate::{admin, assistant, routes};

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
        let mut own = None;
        let metrics =
            service_kit::metrics::for_service(SERVICE, config.runtime_metrics, |registry| {
                let mode = ModeSwitch::new(config.deadline_mode, SERVICE, registry);
                own = Some((mode, Health::new(SERVICE, registry)));
            });
        let (mode, health) = own.expect("the registry was built");
        // Every tool's series exist at 0 from the first scrape.
        metrics.declare_tools(assistant::Tool::ALL.map(assistant::Tool::name));
        // Before the database: a bad precheck setting fails start-up at once.
        let prechecks = Prechecks::new(&config, &metrics)?;
        let mut db_config = DbConfig::default();
        db_config.max_connections = config.db_pool_max_connections;
        db_config.acquire_timeout = Config::ms(config.db_pool_acquire_timeout_ms);
        db_config.idle_in_transaction = Config::ms(config.db_idle_in_transaction_timeout_ms);
        db_config.liveness = Config::ms(config.db_liveness_timeout_ms);
        let db = Db::connect_lazy(config.database_url.expose(), db_config)
            .context("DATABASE_URL is not a valid PostgreSQL URL")?
            .with_metrics(&metrics);
        let plain_db = PlainDb::connect_lazy(config.database_url.expose(), &db_config)
            .context("DATABASE_URL is not a valid PostgreSQL URL")?;
        migrate(&db).await?;
        let shipments = Shipments::from_config(&config, &db);
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
                health,
                shipments,
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
        let draining = self.state.health.clone();
        let shutdown = async move {
            shutdown.await;
            draining.start_draining();
            stop.cancel();
        };
        // The dependencies' gauges, checked in the background while the service runs.
        let every = Config::ms(self.config.dependency_check_every_ms);
        let watch =
            (!every.is_zero()).then(|| tokio::spawn(health::watch(self.state.checked(), every)));
        tokio::join!(
            serve(self.listener, app, shutdown, options),
            serve(self.admin, admin, admin_stop.cancelled_owned(), options),
        );
        if let Some(watch) = watch {
            watch.abort();
        }
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
