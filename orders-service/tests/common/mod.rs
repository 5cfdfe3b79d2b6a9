//! `spawn_app()`: a real catalog-service and a real orders-service on port 0, with a
//! database of their own in the throwaway PostgreSQL.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::{self, Next};
use catalog_service::{FaultConfig, Faults};
use orders_service::{AppState, Application, Config};
use reqwest::Response;
use serde_json::{Value, json};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};
use test_support::{Running, TestDatabase};

pub const MS: fn(u64) -> Duration = Duration::from_millis;

pub struct TestApp {
    pub base: String,
    /// The admin API's base URL (`GET|PUT /admin/mode`).
    pub admin: String,
    pub client: reqwest::Client,
    pub state: AppState,
    pub faults: Faults,
    /// Every `X-Request-Timeout-Ms` the catalog received, in order.
    pub catalog_budgets: Arc<Mutex<Vec<Option<u64>>>>,
    pub database: TestDatabase,
    /// A separate pool for the test's own queries (locks, pg_stat_activity).
    pub side: PgPool,
    pub catalog_url: String,
    orders: Option<Running>,
    catalog: Option<Running>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Like [`spawn_app`], with the orders settings adjusted by `customize`.
pub async fn spawn_app_with(customize: impl FnOnce(&mut Config)) -> TestApp {
    let database = test_support::test_database().await;
    spawn_app_on(database, customize).await
}

/// Like [`spawn_app_with`], on a given database.
pub async fn spawn_app_on(database: TestDatabase, customize: impl FnOnce(&mut Config)) -> TestApp {
    spawn_app_with_catalog(database, |_| {}, customize).await
}

/// Like [`spawn_app_on`], with the catalog's settings adjusted too.
pub async fn spawn_app_with_catalog(
    database: TestDatabase,
    customize_catalog: impl FnOnce(&mut catalog_service::Config),
    customize: impl FnOnce(&mut Config),
) -> TestApp {
    let (catalog_url, faults, catalog_budgets, catalog) =
        spawn_recorded_catalog(customize_catalog).await;
    let mut config = Config::for_tests(&catalog_url, &database.url);
    customize(&mut config);
    let app = Application::build(config)
        .await
        .expect("orders-service builds");
    let base = format!("http://127.0.0.1:{}", app.port());
    let admin = format!("http://127.0.0.1:{}", app.admin_port());
    let state = app.state();
    let side = PgPool::connect_with(side_options(&database.url))
        .await
        .expect("side pool");
    TestApp {
        base,
        admin,
        client: reqwest::Client::new(),
        state,
        faults,
        catalog_budgets,
        database,
        side,
        catalog_url,
        orders: Some(test_support::spawn(|shutdown| app.run_until(shutdown))),
        catalog: Some(catalog),
    }
}

/// A throwaway cluster of the test's own, and its `postgres` database: for a test that
/// changes the server (its settings, a stopped or restarted postmaster) and would
/// disturb the other tests of its process on the shared one. Keep the cluster alive as
/// long as the app.
pub async fn own_cluster() -> (test_support::PgCluster, TestDatabase) {
    let cluster = tokio::task::spawn_blocking(test_support::PgCluster::start)
        .await
        .expect("cluster start-up panicked")
        .expect("a PostgreSQL cluster");
    let database = TestDatabase {
        url: cluster.url("postgres"),
        name: "postgres".into(),
    };
    (cluster, database)
}

/// One unit of `sku`'s stock taken in a transaction under `deadline`, committed.
pub async fn take_one(
    app: &TestApp,
    deadline: &deadline_propagation::Deadline,
    sku: &'static str,
) -> Result<(), deadline_propagation::db::DbError> {
    app.state
        .db
        .transaction(deadline, move |conn| {
            Box::pin(async move {
                sqlx::query("UPDATE inventory SET available = available - 1 WHERE sku = $1")
                    .bind(sku)
                    .execute(&mut *conn)
                    .await?;
                Ok(deadline_propagation::db::End::Commit(()))
            })
        })
        .await
}

/// `SELECT pg_sleep(5)` under `deadline`, through the service's database.
pub async fn sleep_on_server(
    db: &deadline_propagation::db::Db,
    deadline: &deadline_propagation::Deadline,
) -> Result<(), deadline_propagation::db::DbError> {
    db.read(deadline, |conn| {
        Box::pin(async move {
            sqlx::query("SELECT pg_sleep(5)")
                .execute(conn)
                .await
                .map(drop)
        })
    })
    .await
}

/// The test's own sessions name themselves, so queries on `pg_stat_activity` can tell
/// them from the service's pool.
pub const TEST_SESSION: &str = "test-side";

fn side_options(url: &str) -> PgConnectOptions {
    url.parse::<PgConnectOptions>()
        .expect("a PostgreSQL URL")
        .application_name(TEST_SESSION)
}

/// The real catalog router behind a layer that records the budget of every call.
async fn spawn_recorded_catalog(
    customize: impl FnOnce(&mut catalog_service::Config),
) -> (String, Faults, Arc<Mutex<Vec<Option<u64>>>>, Running) {
    let mut config = catalog_service::Config::for_tests();
    customize(&mut config);
    let faults = Faults::new(FaultConfig::default());
    let metrics = deadline_propagation::metrics::Metrics::new("catalog-service");
    let budgets: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let recorder = budgets.clone();
    let pricing = (config.pricing_url.as_deref())
        .map(|url| catalog_service::pricing::Pricing::new(url, config.pricing_retry_every_hop))
        .map(|pricing| pricing.expect("a pricing URL"));
    let router = catalog_service::routes::router(&config, faults.clone(), pricing, metrics).layer(
        middleware::from_fn(move |request: Request, next: Next| {
            let budget = request
                .headers()
                .get("x-request-timeout-ms")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            if request.uri().path().starts_with("/catalog/") {
                recorder.lock().unwrap().push(budget);
            }
            next.run(request)
        }),
    );
    let (url, running) = serve(router).await;
    (url, faults, budgets, running)
}

/// Serves `router` on a free loopback port; returns its base URL.
pub async fn serve(router: axum::Router) -> (String, Running) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let running = test_support::spawn(|shutdown| {
        service_kit::server::serve(
            listener,
            router,
            shutdown,
            service_kit::server::ServerOptions::default(),
        )
    });
    (url, running)
}

impl TestApp {
    pub async fn post_order(
        &self,
        body: Value,
        budget_ms: Option<u64>,
        key: Option<&str>,
    ) -> Response {
        let mut request = self
            .client
            .post(format!("{}/api/orders", self.base))
            .json(&body);
        if let Some(ms) = budget_ms {
            request = request.header("X-Request-Timeout-Ms", ms);
        }
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.expect("request sent")
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("request sent")
    }

    pub async fn order(&self, sku: &str, quantity: i64, budget_ms: Option<u64>) -> Response {
        self.post_order(json!({"sku": sku, "quantity": quantity}), budget_ms, None)
            .await
    }

    /// How many `/catalog/` calls the catalog has received so far.
    pub fn catalog_calls(&self) -> usize {
        self.catalog_budgets.lock().unwrap().len()
    }

    pub fn slow_catalog(&self, delay_ms: u64) {
        self.faults.set(FaultConfig {
            delay_ms,
            ..FaultConfig::default()
        });
    }

    pub async fn stock(&self, sku: &str) -> i64 {
        sqlx::query_scalar::<_, i32>("SELECT available FROM inventory WHERE sku = $1")
            .bind(sku)
            .fetch_one(&self.side)
            .await
            .unwrap()
            .into()
    }

    /// Switches the mode at run time through the admin API, as an operator does.
    pub async fn switch_mode(&self, mode: &str) {
        let switched = self
            .client
            .put(format!("{}/admin/mode", self.admin))
            .json(&json!({"mode": mode}))
            .send()
            .await
            .expect("admin request sent");
        assert_eq!(
            switched.status(),
            reqwest::StatusCode::OK,
            "switching to {mode}"
        );
    }

    pub async fn order_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(&self.side)
            .await
            .unwrap()
    }

    pub async fn order_rows_for(&self, sku: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE sku = $1")
            .bind(sku)
            .fetch_one(&self.side)
            .await
            .unwrap()
    }

    /// Backends of this test's database in `state` ('idle in transaction', ...).
    pub async fn backends_in_state(&self, state: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state = $1",
        )
        .bind(state)
        .fetch_one(&self.side)
        .await
        .unwrap()
    }

    /// Backends of this test's database waiting on a lock.
    pub async fn backends_waiting_on_locks(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
        )
        .fetch_one(&self.side)
        .await
        .unwrap()
    }

    /// A session of the test's own (for locks), outside the service's pool.
    pub async fn side_connection(&self) -> PgConnection {
        PgConnection::connect_with(&side_options(&self.database.url))
            .await
            .expect("a side connection")
    }

    /// The PIDs of the service's sessions on the server: the system of record for
    /// "the connection survived" (a closed and reopened connection gets a new PID).
    pub async fn service_backends(&self) -> std::collections::BTreeSet<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND backend_type = 'client backend' AND application_name <> $1",
        )
        .bind(TEST_SESSION)
        .fetch_all(&self.side)
        .await
        .unwrap()
        .into_iter()
        .collect()
    }

    /// The service's sessions that are doing anything but waiting for a command:
    /// running a statement, or holding a transaction open.
    pub async fn service_statements_in_flight(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND backend_type = 'client backend' AND application_name <> $1 AND state <> 'idle'",
        )
        .bind(TEST_SESSION)
        .fetch_one(&self.side)
        .await
        .unwrap()
    }

    /// The service's sessions waiting on a lock.
    pub async fn service_lock_waiters(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name <> $1 AND wait_event_type = 'Lock'",
        )
        .bind(TEST_SESSION)
        .fetch_one(&self.side)
        .await
        .unwrap()
    }

    /// `GET {base}/metrics` over HTTP (`base`: this app's or its catalog's URL): the
    /// text a Prometheus scrape gets.
    pub async fn scrape(&self, base: &str) -> String {
        test_support::scrape(&self.client, base).await
    }

    pub fn metrics(&self) -> String {
        self.state.metrics.render()
    }

    /// Stops the catalog: its port closes, as when its process is gone.
    pub async fn stop_catalog(&mut self) {
        if let Some(catalog) = self.catalog.take() {
            catalog.shutdown().await;
        }
    }

    pub async fn shutdown(&mut self) {
        if let Some(orders) = self.orders.take() {
            orders.shutdown().await;
        }
    }
}

pub async fn json_of(response: Response) -> Value {
    response.json().await.expect("a JSON body")
}

/// Waits until the pool has no connection checked out and no session is left inside a
/// transaction: nothing leaked.
pub async fn wait_for_idle_pool(app: &TestApp) {
    test_support::wait_until("the pool has no connection in use", MS(2000), || async {
        app.state.db.in_use() == 0
    })
    .await;
    assert_eq!(app.backends_in_state("idle in transaction").await, 0);
}

/// Makes every COMMIT on the database at `url` wait, after its commit record is
/// written, for a synchronous standby that never answers (set through `admin`, a pool
/// on the same cluster).
pub async fn wait_for_a_ghost_standby(url: &str, admin: &PgPool) {
    // The throwaway cluster turns synchronous_commit off for speed; this database's
    // sessions turn it back on.
    let mut session = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("ALTER DATABASE postgres SET synchronous_commit = on")
        .execute(&mut session)
        .await
        .unwrap();
    // Two statements: ALTER SYSTEM cannot run inside the implicit transaction of a batch.
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = 'ghost'",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::query(sql).execute(admin).await.unwrap();
    }
    // The reload reaches each backend at its next command; wait until a fresh session has it.
    test_support::wait_until("the standby setting is in force", MS(3000), || async {
        sqlx::query_scalar::<_, String>(
            "SELECT setting FROM pg_settings WHERE name = 'synchronous_standby_names'",
        )
        .fetch_one(admin)
        .await
        .unwrap()
            == "ghost"
    })
    .await;
}

/// Waits until one session of the database `side` watches waits on `wait_event`
/// (`SyncRep`: a COMMIT waiting for the standby; `PgSleep`: a statement sleeping).
pub async fn wait_for_one_waiting_on(side: &PgPool, wait_event: &str) {
    let what = format!("a session waits on {wait_event}");
    test_support::wait_until(&what, MS(3000), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = $1 \
             AND application_name <> $2",
        )
        .bind(wait_event)
        .bind(TEST_SESSION)
        .fetch_one(side)
        .await
        .unwrap()
            == 1
    })
    .await;
}
