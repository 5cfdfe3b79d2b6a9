//! What catalog-service exports besides request metrics, read from a real scrape over
//! HTTP: its budget policy, the injected delay as the admin API changes it, the process
//! and its tokio runtime, and no exemplar when no trace is active.

use catalog_service::{Application, Config};
use reqwest::StatusCode;
use serde_json::json;
use test_support::{Running, metric_value};

struct TestApp {
    base: String,
    admin: String,
    client: reqwest::Client,
    _running: Running,
}

async fn spawn_app(config: Config) -> TestApp {
    let app = Application::build(config).await.expect("catalog builds");
    TestApp {
        base: format!("http://127.0.0.1:{}", app.port()),
        admin: format!("http://127.0.0.1:{}/admin/faults", app.admin_port()),
        client: reqwest::Client::new(),
        _running: test_support::spawn(|shutdown| app.run_until(shutdown)),
    }
}

impl TestApp {
    async fn scrape(&self) -> String {
        let response = self
            .client
            .get(format!("{}/metrics", self.base))
            .header("Accept", "application/openmetrics-text")
            .send()
            .await
            .expect("scrape sent");
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.expect("a text exposition")
    }

    async fn fault_delay(&self) -> Option<f64> {
        metric_value(&self.scrape().await, "catalog_fault_delay_seconds", "")
    }
}

#[tokio::test]
async fn the_budget_policy_is_exported_as_configured_without_a_reserve() {
    let mut config = Config::for_tests();
    config.deadline_max_ms = 1234;
    config.deadline_default_ms = 567;
    let app = spawn_app(config).await;
    let text = app.scrape().await;
    let policy = |kind: &str| {
        let labels = format!(r#"service="catalog-service",kind="{kind}""#);
        metric_value(&text, "deadline_policy_seconds", &labels)
    };
    assert_eq!(policy("max"), Some(1.234), "{text}");
    assert_eq!(policy("default"), Some(0.567));
    // The catalog calls nothing downstream: it keeps no reserve.
    assert_eq!(policy("reserve"), None);
}

#[tokio::test]
async fn the_fault_delay_follows_start_up_and_the_admin_api() {
    let mut config = Config::for_tests();
    config.fault_delay_ms = 40;
    let app = spawn_app(config).await;
    assert_eq!(app.fault_delay().await, Some(0.04), "the start-up delay");
    let set = json!({"delay_ms": 1500, "jitter_ms": 20});
    let response = app.client.put(&app.admin).json(&set).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(app.fault_delay().await, Some(1.5), "after PUT");
    let response = app.client.delete(&app.admin).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.fault_delay().await, Some(0.0), "0 after DELETE");
}

#[tokio::test]
async fn process_metrics_are_present_and_no_exemplar_without_a_trace() {
    let app = spawn_app(Config::for_tests()).await;
    let response = app
        .client
        .get(format!("{}/catalog/SKU-00001", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = app.scrape().await;
    let rss = metric_value(&text, "process_resident_memory_bytes", "").unwrap_or(0.0);
    assert!(rss > 1_000_000.0, "resident memory {rss} in\n{text}");
    assert!(metric_value(&text, "process_cpu_seconds_total", "").is_some());
    assert!(text.contains("# TYPE process_cpu_seconds counter"));
    // The runtime that serves the scrape: this test's, one worker.
    assert_eq!(
        metric_value(&text, "tokio_workers", ""),
        Some(1.0),
        "{text}"
    );
    assert!(text.contains("# TYPE tokio_worker_busy_seconds counter"));
    assert!(metric_value(&text, "tokio_worker_busy_seconds_total", "").is_some());
    // At least the accept loops of both ports are tasks of their own.
    let alive = metric_value(&text, "tokio_alive_tasks", "").unwrap_or(0.0);
    assert!(alive >= 2.0, "alive tasks {alive}");
    assert!(metric_value(&text, "tokio_global_queue_depth", "").is_some());
    // No OpenTelemetry layer in this test binary: no request has a sampled trace.
    let bucket = r#"http_server_requests_seconds_bucket{le="10.0",method="GET",uri="/catalog/{sku}",status="200"} 1"#;
    assert!(text.lines().any(|line| line == bucket), "{text}");
    assert!(
        !text.contains("trace_id"),
        "an exemplar without a trace:\n{text}"
    );
}

#[tokio::test]
async fn runtime_metrics_switched_off_leave_out_every_tokio_family() {
    let mut config = Config::for_tests();
    config.runtime_metrics = false;
    let app = spawn_app(config).await;
    let text = app.scrape().await;
    assert!(!text.contains("tokio_"), "{text}");
    // The rest is there as usual.
    assert!(metric_value(&text, "process_cpu_seconds_total", "").is_some());
}
