//! The budgeted client against real sockets: what a downstream's 503 becomes, and the
//! pool gauges as a scrape of `/metrics` sees them.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::get;
use shared::Deadline;
use shared::client::{AdmissionMode, BudgetedClient, CallError, ClientConfig};
use shared::metrics::Metrics;
use shared::server::{ServerOptions, serve};
use shared::stage::Downstream;
use test_support::{Running, metric_value};
use tokio::net::TcpListener;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Serves `router` on a free loopback port; returns its base URL.
async fn serve_on_port_0(router: Router) -> (String, Running) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let running =
        test_support::spawn(|shutdown| serve(listener, router, shutdown, ServerOptions::default()));
    (url, running)
}

fn client(base_url: &str, max_connections: usize, metrics: &Metrics) -> BudgetedClient {
    let config = ClientConfig {
        name: Downstream::CATALOG,
        base_url: base_url.to_owned(),
        max_connections,
        pending_max: 100_000,
        acquire_timeout: Duration::from_secs(10),
        reserve: MS(5),
        admission: AdmissionMode::Off,
        idle_timeout: Duration::from_secs(1),
    };
    BudgetedClient::new(config, Some(metrics.client().clone())).expect("the client builds")
}

/// A downstream that is overloaded: 503 with the `Retry-After` named in the path.
fn overloaded_downstream() -> Router {
    let answer = |retry_after: Option<&'static str>| {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert(header::RETRY_AFTER, value.parse().unwrap());
        }
        (StatusCode::SERVICE_UNAVAILABLE, headers, "busy")
    };
    Router::new()
        .route("/seven", get(move || async move { answer(Some("7")) }))
        .route("/none", get(move || async move { answer(None) }))
        .route("/garbage", get(move || async move { answer(Some("soon")) }))
}

#[tokio::test]
async fn a_downstream_503_is_passed_on_with_its_own_retry_after() {
    let (url, _downstream) = serve_on_port_0(overloaded_downstream()).await;
    let client = client(&url, 4, &Metrics::new("test"));
    // A missing or unreadable Retry-After gets the default of one second.
    for (path, expected) in [("/seven", "7"), ("/none", "1"), ("/garbage", "1")] {
        let err = client
            .get_bytes(&Deadline::after(Duration::from_secs(5)), path)
            .await
            .expect_err("the downstream answers 503");
        assert!(
            matches!(err, CallError::DownstreamOverloaded { .. }),
            "{path}: {err:?}"
        );
        let response =
            axum::response::IntoResponse::into_response(err.into_problem(Downstream::CATALOG));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], expected, "{path}");
    }
}

/// The pool gauges as a scraper reads them: `GET /metrics` over HTTP.
async fn scrape_pool_gauges(metrics_url: &str) -> (Option<f64>, Option<f64>) {
    let text = reqwest::get(format!("{metrics_url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let gauge = |name| metric_value(&text, name, r#"client="catalog""#);
    (
        gauge("http_client_pool_pending_acquires"),
        gauge("http_client_pool_active_connections"),
    )
}

/// Thousands of slot holders finishing, waiters timing out and tasks aborted at any
/// point, on several worker threads at once: when all of them are gone, both gauges
/// must read exactly 0. A gauge that is *set* from counts read a moment earlier can be
/// overwritten by a stale value and stay above 0 forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pool_gauges_return_to_exactly_zero_after_a_storm_of_completions_and_cancellations() {
    let metrics = Metrics::new("test");
    let (metrics_url, _scrape) = serve_on_port_0(metrics.router()).await;
    // No call is sent: the storm is on the bulkhead the client puts in front of reqwest.
    let client = client("http://127.0.0.1:9", 3, &metrics);
    let bulkhead = Arc::clone(client.bulkhead());
    for round in 0..40 {
        let tasks: Vec<_> = (0..600)
            .map(|i| {
                let bulkhead = Arc::clone(&bulkhead);
                tokio::spawn(async move {
                    // Every third waiter gives up after a few microseconds.
                    let wait = if i % 3 == 1 {
                        Duration::from_micros(50)
                    } else {
                        MS(10_000)
                    };
                    if let Ok(slot) = bulkhead.acquire(Some(wait)).await {
                        tokio::task::yield_now().await;
                        drop(slot);
                    }
                })
            })
            .collect();
        // Cancel every fifth task wherever it happens to be: waiting, or holding a slot.
        for task in tasks.iter().step_by(5) {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        assert_eq!(bulkhead.pending(), 0);
        assert_eq!(bulkhead.active(), 0);
        assert_eq!(
            scrape_pool_gauges(&metrics_url).await,
            (Some(0.0), Some(0.0)),
            "round {round}: (pending, active) as scraped from /metrics"
        );
    }
}
