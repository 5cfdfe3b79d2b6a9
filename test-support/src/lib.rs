//! Dev-only helpers for the integration tests. Not part of the product.
//!
//! - [`postgres`]: a throwaway PostgreSQL cluster from the local binaries, one database
//!   per test. `DATABASE_URL` points the tests at an existing server instead.
//! - [`spawn`]: run an application in the background with a shutdown handle.
//! - [`wait_until`]: wait on a condition instead of sleeping and hoping.
//! - [`exposition`]: the Prometheus text parser ([`metric_value`] reads one sample).
//! - [`process`]: the service binaries as child processes.
//! - [`served_openapi`]: a service's OpenAPI document, checked against its committed copy.
//! - [`net`]: network faults on a real link (partition, one way lost, SYNs dropped,
//!   loss, delay), removed when the test ends.

pub mod exposition;
pub mod net;
pub mod postgres;
mod privilege;
pub mod process;

use std::future::Future;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use exposition::{metric_value, scrape};
pub use postgres::{PgCluster, TestDatabase, test_database};
pub use process::ServiceProcess;

/// A running application and the means to stop it.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    /// Starts graceful shutdown and waits for the application to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs `run(shutdown)` on the runtime; the returned handle resolves `shutdown`.
pub fn spawn<F, Fut>(run: F) -> Running
where
    F: FnOnce(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = Box::pin(async move {
        let _ = stopped.await;
    });
    Running {
        stop: Some(stop),
        task: tokio::spawn(run(shutdown)),
    }
}

/// Polls `condition` every 10 ms until it holds; panics with `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    loop {
        if condition().await {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The paths a served OpenAPI document lists, in its order (what the services' tests
/// hold against the routes they mean to publish).
pub fn openapi_paths(document: &serde_json::Value) -> Vec<&str> {
    document["paths"]
        .as_object()
        .expect("the document has paths")
        .keys()
        .map(String::as_str)
        .collect()
}

/// The OpenAPI document the service at `base` serves at `/openapi.json`, asserted to be
/// `application/json`, OpenAPI 3.1 and byte for byte the committed file at `committed`
/// (relative to the workspace root); returned for the test's own assertions. With
/// `UPDATE_OPENAPI=1` in the environment the served document is written there instead.
/// What clients generate their code from is then what the service really serves.
pub async fn served_openapi(
    client: &reqwest::Client,
    base: &str,
    committed: &str,
) -> serde_json::Value {
    let response = client
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .expect("GET /openapi.json");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let served = response.text().await.expect("the document's body");
    let document: serde_json::Value = serde_json::from_str(&served).expect("a JSON document");
    assert_eq!(document["openapi"], "3.1.0");

    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(committed);
    if std::env::var_os("UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(&file, &served).unwrap_or_else(|e| panic!("writing {committed}: {e}"));
    } else {
        let on_disk = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(
            on_disk == served,
            "{committed} is not what the service serves at /openapi.json; if the change is \
             meant, rerun this test with UPDATE_OPENAPI=1 and commit the file"
        );
    }
    document
}
