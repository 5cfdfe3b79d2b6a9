//! The chaos run's stack: the services as real child processes, PostgreSQL from
//! test-support, and the fault controls the run uses.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use test_support::process::free_port;
use test_support::{PgCluster, ServiceProcess, wait_until};

/// A service binary running as a child process (test-support's, the one way the
/// harness starts services), killed when dropped.
pub(crate) struct Service(ServiceProcess);

impl Service {
    pub(crate) fn start(binary: &Path, env: &[(&str, String)], log: PathBuf) -> Self {
        Self(ServiceProcess::start(binary, env, log).expect("cannot start the service"))
    }

    pub(crate) fn kill(&mut self) {
        self.0.kill();
    }

    pub(crate) fn log(&self) -> PathBuf {
        self.0.log().to_path_buf()
    }

    pub(crate) fn rss_kib(&self) -> u64 {
        self.0.rss_kib()
    }
}

/// catalog-service's binary, built next to this package's by `cargo test --workspace`.
pub(crate) fn catalog_binary() -> PathBuf {
    let orders = PathBuf::from(env!("CARGO_BIN_EXE_orders-service"));
    let path = orders.with_file_name("catalog-service");
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo test --workspace builds it)",
        path.display()
    );
    path
}

pub(crate) struct Stack {
    pub(crate) orders_url: String,
    pub(crate) catalog_url: String,
    pub(crate) admin_url: String,
    pub(crate) catalog_env: Vec<(&'static str, String)>,
    pub(crate) catalog: Mutex<Service>,
    pub(crate) client: reqwest::Client,
}

impl Stack {
    /// PostgreSQL, catalog-service and orders-service (with small pools, so the faults
    /// bite), each a real process logging into `work`; returns once orders is ready.
    pub(crate) async fn start(work: &std::path::Path) -> (Self, Service, PgCluster) {
        let cluster = tokio::task::spawn_blocking(PgCluster::start)
            .await
            .unwrap()
            .unwrap();
        let database_url = cluster.url("postgres");
        let (catalog_port, admin_port, orders_port) = (free_port(), free_port(), free_port());
        let catalog_env = vec![
            ("CATALOG_LISTEN_ADDR", format!("127.0.0.1:{catalog_port}")),
            ("CATALOG_ADMIN_ADDR", format!("127.0.0.1:{admin_port}")),
        ];
        let catalog = Service::start(&catalog_binary(), &catalog_env, work.join("catalog.log"));
        let orders = Service::start(
            &PathBuf::from(env!("CARGO_BIN_EXE_orders-service")),
            &[
                ("ORDERS_LISTEN_ADDR", format!("127.0.0.1:{orders_port}")),
                // Not used here, and its default (9080) may be taken on this machine.
                ("ORDERS_ADMIN_ADDR", "127.0.0.1:0".into()),
                ("CATALOG_URL", format!("http://127.0.0.1:{catalog_port}")),
                ("DATABASE_URL", database_url),
                ("CATALOG_POOL_MAX_CONNECTIONS", "8".into()),
                ("CATALOG_POOL_PENDING_MAX", "8".into()),
                ("DB_POOL_MAX_CONNECTIONS", "8".into()),
            ],
            work.join("orders.log"),
        );
        let stack = Self {
            orders_url: format!("http://127.0.0.1:{orders_port}"),
            catalog_url: format!("http://127.0.0.1:{catalog_port}"),
            admin_url: format!("http://127.0.0.1:{admin_port}"),
            catalog_env,
            catalog: Mutex::new(catalog),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .unwrap(),
        };
        let ready = format!("{}/readyz", stack.orders_url);
        wait_until(
            "orders-service is ready",
            Duration::from_secs(30),
            || async {
                stack
                    .client
                    .get(&ready)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
        (stack, orders, cluster)
    }

    /// The catalog's public port (the link the run cuts).
    pub(crate) fn catalog_port(&self) -> u16 {
        self.catalog_url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port")
    }

    pub(crate) async fn set_faults(&self, faults: Value) {
        let _ = self
            .client
            .put(format!("{}/admin/faults", self.admin_url))
            .json(&faults)
            .send()
            .await;
    }

    pub(crate) async fn restart_catalog(&self, down_for: Duration) {
        self.catalog.lock().unwrap().kill();
        tokio::time::sleep(down_for).await;
        let log = self.catalog.lock().unwrap().log();
        *self.catalog.lock().unwrap() = Service::start(&catalog_binary(), &self.catalog_env, log);
        let health = format!("{}/healthz", self.catalog_url);
        wait_until("the catalog is back", Duration::from_secs(10), || async {
            self.client
                .get(&health)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
    }

    pub(crate) async fn metrics(&self, url: &str) -> String {
        match self.client.get(format!("{url}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}
