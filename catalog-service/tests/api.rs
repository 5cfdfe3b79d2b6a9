//! catalog-service over real HTTP on port 0.

use std::time::Duration;

use catalog_service::{Application, Config, FaultConfig, Faults};
use deadline_propagation::metrics::Metrics;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::{Running, metric_value, wait_until};
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

struct TestApp {
    base: String,
    admin: String,
    faults: Faults,
    metrics: Metrics,
    client: reqwest::Client,
    _running: Running,
}

async fn spawn_app() -> TestApp {
    spawn_app_with(Config::for_tests()).await
}

async fn spawn_app_with(config: Config) -> TestApp {
    let app = Application::build(config).await.expect("catalog builds");
    let base = format!("http://127.0.0.1:{}", app.port());
    let admin = format!("http://127.0.0.1:{}", app.admin_port());
    let (faults, metrics) = (app.faults(), app.metrics());
    TestApp {
        base,
        admin,
        faults,
        metrics,
        client: reqwest::Client::new(),
        _running: test_support::spawn(|shutdown| app.run_until(shutdown)),
    }
}

impl TestApp {
    async fn get_item(&self, sku: &str, budget_ms: Option<u64>) -> reqwest::Response {
        let mut request = self.client.get(format!("{}/catalog/{sku}", self.base));
        if let Some(ms) = budget_ms {
            request = request.header("X-Request-Timeout-Ms", ms);
        }
        request.send().await.expect("request sent")
    }

    fn in_flight(&self) -> f64 {
        metric_value(
            &self.metrics.render(),
            "http_server_requests_in_flight",
            r#"uri="/catalog/{sku}""#,
        )
        .unwrap_or(0.0)
    }
}

#[tokio::test]
async fn a_known_sku_returns_its_item() {
    let app = spawn_app().await;
    let response = app.get_item("SKU-00042", None).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().contains_key("server-timing"));
    let item: Value = response.json().await.unwrap();
    assert_eq!(item["sku"], "SKU-00042");
    assert!(item["price_cents"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn an_unknown_sku_is_a_404_problem() {
    let app = spawn_app().await;
    let response = app.get_item("SKU-99999", None).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
}

#[tokio::test]
async fn a_1s_injected_delay_under_a_300ms_budget_ends_with_a_504_within_400ms() {
    let app = spawn_app().await;
    app.faults.set(FaultConfig {
        delay_ms: 1000,
        ..FaultConfig::default()
    });
    let started = Instant::now();
    let response = app.get_item("SKU-00001", Some(300)).await;
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(took >= MS(300) && took < MS(400), "answered after {took:?}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["stage"], "ingress");
    assert_eq!(problem["budget_ms"], 300);
}

#[tokio::test]
async fn a_budget_above_the_maximum_is_clamped_to_it() {
    let mut config = Config::for_tests();
    config.deadline_max_ms = 200;
    let app = spawn_app_with(config).await;
    app.faults.set(FaultConfig {
        delay_ms: 1000,
        ..FaultConfig::default()
    });
    let started = Instant::now();
    let response = app.get_item("SKU-00001", Some(60_000)).await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(started.elapsed() < MS(300), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_client_that_disconnects_mid_delay_stops_the_work() {
    let app = spawn_app().await;
    app.faults.set(FaultConfig {
        delay_ms: 3000,
        ..FaultConfig::default()
    });
    let client = reqwest::Client::builder().timeout(MS(300)).build().unwrap();
    let url = format!("{}/catalog/SKU-00001", app.base);
    let request = tokio::spawn(async move { client.get(url).send().await });
    wait_until("the request is in flight", MS(2000), || async {
        app.in_flight() == 1.0
    })
    .await;
    let started = Instant::now();
    assert!(
        request.await.unwrap().is_err(),
        "the client gave up at 300 ms"
    );
    // The handler's 3 s sleep must end with the connection, not at 3 s.
    wait_until("in-flight returns to 0", MS(1000), || async {
        app.in_flight() == 0.0
    })
    .await;
    assert!(started.elapsed() < MS(1000));
}

#[tokio::test]
async fn the_admin_api_is_not_served_on_the_public_port() {
    let app = spawn_app().await;
    for method in [
        reqwest::Method::GET,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
    ] {
        let response = app
            .client
            .request(method.clone(), format!("{}/admin/faults", app.base))
            .json(&json!({"delay_ms": 5000}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{method}");
    }
    assert_eq!(app.faults.get(), FaultConfig::default());
}

#[tokio::test]
async fn the_admin_api_sets_reads_and_resets_faults() {
    let app = spawn_app().await;
    let url = format!("{}/admin/faults", app.admin);
    let set = json!({"delay_ms": 1000, "jitter_ms": 50, "error_rate": 0.25, "busy_ms": 5,
                     "straggler_rate": 0.01, "straggler_ms": 1000, "unavailable_rate": 0.5,
                     "panic_rate": 0.1});
    let response = app.client.put(&url).json(&set).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let read: Value = app
        .client
        .get(&url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read, set);
    let response = app.client.delete(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.faults.get(), FaultConfig::default());
}

#[tokio::test]
async fn bad_admin_input_is_rejected_and_changes_nothing() {
    let app = spawn_app().await;
    let url = format!("{}/admin/faults", app.admin);
    let cases: [(&str, &str, StatusCode); 13] = [
        ("application/json", "{not json", StatusCode::BAD_REQUEST),
        (
            "application/json",
            r#"{"delay_ms": -5}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"delay_ms": 60001}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"error_rate": 1.5}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"error_rate": -0.1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"busy_ms": 1001}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"busy_ms": -1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"straggler_rate": 1.01}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"straggler_ms": 60001}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"unavailable_rate": -1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"panic_rate": 1.5}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "application/json",
            r#"{"delay": 5}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "text/plain",
            r#"{"delay_ms": 5}"#,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
    ];
    for (content_type, body, expected) in cases {
        let response = app
            .client
            .put(&url)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), expected, "{body}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: Value = response.json().await.unwrap();
        let detail = problem["detail"].as_str().unwrap();
        assert!(!detail.is_empty());
        for field in [
            "busy_ms",
            "straggler_rate",
            "straggler_ms",
            "unavailable_rate",
            "panic_rate",
        ] {
            if body.contains(field) {
                assert!(detail.contains(field), "{detail}");
            }
        }
    }
    assert_eq!(app.faults.get(), FaultConfig::default());
}

/// The busy fault holds a worker thread the way a CPU-bound handler does: the
/// deadline cannot cut it, and the runtime's busy time grows by at least as much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_fault_holds_a_worker_past_the_budget_and_counts_as_busy_time() {
    let app = spawn_app().await;
    let busy = |app: &TestApp| {
        metric_value(&app.metrics.render(), "tokio_worker_busy_seconds_total", "")
            .expect("the runtime's busy time is exported")
    };
    let before = busy(&app);
    app.faults.set(FaultConfig {
        busy_ms: 300,
        ..FaultConfig::default()
    });
    let started = Instant::now();
    let response = app.get_item("SKU-00001", Some(50)).await;
    let elapsed = started.elapsed();
    assert!(elapsed >= MS(300), "answered after {elapsed:?}");
    // Nothing polled the deadline while the worker spun: the handler finished first.
    assert_eq!(response.status(), StatusCode::OK);
    wait_until("the spin shows as busy time", MS(5000), || async {
        busy(&app) - before >= 0.3
    })
    .await;
}

#[tokio::test]
async fn the_start_up_fault_delay_applies_to_every_answer() {
    let mut config = Config::for_tests();
    config.fault_delay_ms = 200;
    let app = spawn_app_with(config).await;
    let started = Instant::now();
    assert_eq!(
        app.get_item("SKU-00001", None).await.status(),
        StatusCode::OK
    );
    assert!(started.elapsed() >= MS(200));
}

/// A call marked `X-Deadline-Mode: observe` with a budget shorter than the catalog's
/// delay: observed (answered when the work is done) by default, refused at its budget
/// when `CATALOG_HONOUR_OBSERVE` is off.
#[tokio::test]
async fn the_observe_marker_is_honoured_only_while_the_setting_allows_it() {
    for (honour, expected) in [(true, StatusCode::OK), (false, StatusCode::GATEWAY_TIMEOUT)] {
        let mut config = Config::for_tests();
        config.fault_delay_ms = 300;
        config.honour_observe = honour;
        let app = spawn_app_with(config).await;
        let response = app
            .client
            .get(format!("{}/catalog/SKU-00001", app.base))
            .header("X-Request-Timeout-Ms", 100)
            .header("X-Deadline-Mode", "observe")
            .send()
            .await
            .expect("request sent");
        assert_eq!(
            response.status(),
            expected,
            "CATALOG_HONOUR_OBSERVE={honour}"
        );
    }
}

#[tokio::test]
async fn an_injected_error_rate_of_one_fails_every_call_with_a_500_problem() {
    let app = spawn_app().await;
    app.faults.set(FaultConfig {
        error_rate: 1.0,
        ..FaultConfig::default()
    });
    let response = app.get_item("SKU-00001", None).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["detail"], "internal error");
}

#[tokio::test]
async fn a_straggler_waits_its_extra_time_and_the_other_calls_do_not() {
    let app = spawn_app().await;
    let timed = async |app: &TestApp| {
        let started = std::time::Instant::now();
        let response = app.get_item("SKU-00001", None).await;
        assert_eq!(response.status(), StatusCode::OK);
        started.elapsed()
    };
    let straggling = |rate| FaultConfig {
        straggler_rate: rate,
        straggler_ms: 300,
        ..FaultConfig::default()
    };
    app.faults.set(straggling(1.0));
    let slow = timed(&app).await;
    assert!(slow >= Duration::from_millis(300), "{slow:?}");
    app.faults.set(straggling(0.0));
    let quick = timed(&app).await;
    assert!(quick < Duration::from_millis(200), "{quick:?}");
}

#[tokio::test]
async fn an_unavailable_rate_of_one_refuses_every_call_at_once_with_a_503() {
    let app = spawn_app().await;
    app.faults.set(FaultConfig {
        unavailable_rate: 1.0,
        delay_ms: 5000,
        ..FaultConfig::default()
    });
    let started = std::time::Instant::now();
    let response = app.get_item("SKU-00001", None).await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refused before the delay"
    );
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "urn:problem:overloaded");
}

/// A handler that panics is answered like any other bug: 500 `urn:problem:internal`,
/// timed and counted, without the panic's text; the connection stays up for the next call.
#[tokio::test]
async fn a_panicking_handler_is_answered_500_as_a_problem_without_its_text() {
    let app = spawn_app().await;
    app.faults.set(FaultConfig {
        panic_rate: 1.0,
        ..FaultConfig::default()
    });
    let response = app.get_item("SKU-00001", None).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    assert!(response.headers().contains_key("server-timing"));
    let body = response.text().await.unwrap();
    assert!(
        !body.contains("panic"),
        "the panic's text is not sent: {body}"
    );
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["type"], "urn:problem:internal");
    assert_eq!(problem["status"], 500);
    assert_eq!(problem["detail"], "internal error");
    let counted = metric_value(
        &app.metrics.render(),
        "http_server_requests_seconds_count",
        r#"method="GET",uri="/catalog/{sku}",status="500""#,
    );
    assert_eq!(counted, Some(1.0));

    app.faults.set(FaultConfig::default());
    let response = app.get_item("SKU-00001", None).await;
    assert_eq!(response.status(), StatusCode::OK);
}

/// Every answer names its request in `x-request-id`: the caller's own, or a new UUID,
/// also on the ingress's refusals and on a path that has no route.
#[tokio::test]
async fn every_answer_carries_the_request_id_the_callers_or_a_new_one() {
    let app = spawn_app().await;
    let id = |response: &reqwest::Response| {
        response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let first = id(&app.get_item("SKU-00001", None).await);
    let second = id(&app.get_item("SKU-00001", None).await);
    for made in [&first, &second] {
        let parts: Vec<usize> = made.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "a UUID: {made}");
    }
    assert_ne!(first, second);

    let sent = |path: &str, budget: &str| {
        app.client
            .get(format!("{}{path}", app.base))
            .header("x-request-id", "checkout-7")
            .header("X-Request-Timeout-Ms", budget)
            .send()
    };
    for (path, budget, status) in [
        ("/catalog/SKU-00001", "500", StatusCode::OK),
        ("/catalog/SKU-00001", "soon", StatusCode::BAD_REQUEST),
        ("/catalog/SKU-99999", "500", StatusCode::NOT_FOUND),
        ("/no/such/path", "500", StatusCode::NOT_FOUND),
    ] {
        let response = sent(path, budget).await.unwrap();
        assert_eq!(response.status(), status, "{path}");
        assert_eq!(id(&response), "checkout-7", "{path} {budget}");
    }
}

#[tokio::test]
async fn healthz_answers_and_metrics_are_exposed() {
    let app = spawn_app().await;
    let health = app
        .client
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    app.get_item("SKU-00001", None).await;
    let metrics = test_support::scrape(&app.client, &app.base).await;
    assert!(metrics.contains(r#"http_server_requests_seconds_count{method="GET",uri="/catalog/{sku}",status="200"} 1"#), "{metrics}");
}

#[test]
fn an_invalid_setting_stops_start_up_with_a_message_naming_the_variable() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_catalog-service"))
        .env("DEADLINE_MAX_MS", "soon")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DEADLINE_MAX_MS"), "{stderr}");
}

#[test]
fn help_documents_every_setting_with_its_default() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_catalog-service"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for variable in [
        "CATALOG_LISTEN_ADDR",
        "CATALOG_ADMIN_ADDR",
        "DEADLINE_MAX_MS",
        "DEADLINE_DEFAULT_MS",
        "CATALOG_FAULT_DELAY_MS",
        "RUNTIME_METRICS",
    ] {
        assert!(
            help.contains(&format!("env: {variable}")),
            "{variable} missing:\n{help}"
        );
    }
    assert!(help.contains("[default: 5000]"));
}

#[tokio::test]
async fn shutdown_drains_an_in_flight_request() {
    let app = Application::build(Config::for_tests()).await.unwrap();
    let base = format!("http://127.0.0.1:{}", app.port());
    app.faults().set(FaultConfig {
        delay_ms: 300,
        ..FaultConfig::default()
    });
    let metrics = app.metrics();
    let running = test_support::spawn(|shutdown| app.run_until(shutdown));
    let request = tokio::spawn(async move {
        reqwest::get(format!("{base}/catalog/SKU-00001"))
            .await
            .map(|r| r.status())
    });
    wait_until("the request is in flight", MS(2000), || async {
        metric_value(
            &metrics.render(),
            "http_server_requests_in_flight",
            r#"uri="/catalog/{sku}""#,
        ) == Some(1.0)
    })
    .await;
    running.shutdown().await;
    assert_eq!(request.await.unwrap().unwrap(), StatusCode::OK);
}

#[tokio::test]
async fn the_served_document_is_the_committed_one() {
    let app = spawn_app().await;
    let document =
        test_support::served_openapi(&app.client, &app.base, "docs/openapi/catalog-service.json")
            .await;
    let paths = test_support::openapi_paths(&document);
    assert_eq!(paths, ["/catalog/{sku}", "/healthz"]);
}
