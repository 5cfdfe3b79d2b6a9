//! The real binary as an operator meets it: what it prints (no secret in `--help`,
//! `Debug` or its logs) and how it names itself in the traces it exports (the standard
//! `OTEL_SERVICE_NAME`, read by a real OTLP/HTTP receiver).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use clap::Parser as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use orders_service::Config;
use prost::Message as _;
use test_support::process::{ServiceProcess, free_port};
use test_support::wait_until;

const PASSWORD: &str = "s3cret-pw-7Q";
const API_KEY: &str = "sk-test-key-9Z";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_orders-service"))
}

/// `database_url` with the test's password in it, in both places sqlx reads one: the
/// user info and the query (the throwaway cluster trusts every local connection, so it
/// connects whatever the password).
fn with_password(database_url: &str) -> String {
    let url = database_url.replacen("://postgres@", &format!("://postgres:{PASSWORD}@"), 1);
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}password={PASSWORD}")
}

#[test]
fn help_shows_neither_the_database_password_nor_the_api_key() {
    let output = Command::new(binary())
        .arg("--help")
        .env(
            "DATABASE_URL",
            format!("postgres://orders:{PASSWORD}@db/orders"),
        )
        .env("ASSISTANT_LLM_API_KEY", API_KEY)
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("DATABASE_URL"), "{help}");
    assert!(
        !help.contains(PASSWORD),
        "--help prints the password:\n{help}"
    );
    assert!(
        !help.contains(API_KEY),
        "--help prints the API key:\n{help}"
    );
}

#[test]
fn the_configurations_debug_shows_neither() {
    // sqlx takes the password from the user info or from the query.
    for (url, expected) in [
        (
            format!("postgres://orders:{PASSWORD}@db:5432/orders"),
            "postgres://orders:***@db:5432/orders",
        ),
        (
            format!("postgres://orders@db:5432/orders?sslmode=disable&password={PASSWORD}"),
            "postgres://orders@db:5432/orders?sslmode=disable&password=***",
        ),
    ] {
        let config = Config::parse_from([
            "orders-service",
            &format!("--database-url={url}"),
            &format!("--assistant-llm-api-key={API_KEY}"),
        ]);
        let shown = format!("{config:?}");
        assert!(shown.contains(expected), "{shown}");
        assert!(
            !shown.contains(PASSWORD) && !shown.contains(API_KEY),
            "{shown}"
        );
    }
}

/// At `debug` level, from start to a SIGTERM, with orders served in between and an
/// assistant planner that fails (so its request is logged), no line carries either.
#[tokio::test]
async fn no_log_line_carries_the_password_or_the_api_key() {
    let database = test_support::test_database().await;
    let (port, admin) = (free_port(), free_port());
    let log = log_file("secrets");
    let mut orders = ServiceProcess::start(
        binary(),
        &[
            ("RUST_LOG", "debug".into()),
            ("ORDERS_LISTEN_ADDR", format!("127.0.0.1:{port}")),
            ("ORDERS_ADMIN_ADDR", format!("127.0.0.1:{admin}")),
            ("DATABASE_URL", with_password(&database.url)),
            ("CATALOG_URL", "http://127.0.0.1:9".into()),
            ("ASSISTANT_LLM_URL", "http://127.0.0.1:9/v1".into()),
            ("ASSISTANT_LLM_API_KEY", API_KEY.into()),
        ],
        log.clone(),
    )
    .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_until(
        "orders-service answers",
        Duration::from_secs(30),
        || async { client.get(format!("{base}/readyz")).send().await.is_ok() },
    )
    .await;
    let _ = client
        .post(format!("{base}/api/orders"))
        .json(&serde_json::json!({"sku": "SKU-00001", "quantity": 1}))
        .send()
        .await;
    let _ = client
        .post(format!("{base}/api/assistant/chat"))
        .json(&serde_json::json!({"message": "price of SKU-00001"}))
        .send()
        .await;
    orders.stop(Duration::from_secs(10));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.lines().count() > 3,
        "too few lines to mean anything:\n{logged}"
    );
    assert!(
        !logged.contains(PASSWORD),
        "a log line carries the password:\n{logged}"
    );
    assert!(
        !logged.contains(API_KEY),
        "a log line carries the API key:\n{logged}"
    );
}

#[tokio::test]
async fn traces_name_the_service_as_otel_service_name_says() {
    let names = exported_service_names(Some("shop-orders")).await;
    assert!(names.iter().all(|name| name == "shop-orders"), "{names:?}");
}

#[tokio::test]
async fn traces_name_the_service_orders_service_when_nothing_says() {
    let names = exported_service_names(None).await;
    assert!(
        names.iter().all(|name| name == "orders-service"),
        "{names:?}"
    );
}

/// Runs the binary exporting to a receiver of the test's own, with `OTEL_SERVICE_NAME`
/// set to `name` or unset, serves a request, and returns the `service.name` of every
/// batch of spans the receiver got (at least one).
async fn exported_service_names(name: Option<&str>) -> Vec<String> {
    let names: Arc<Mutex<Vec<String>>> = Arc::default();
    let received = names.clone();
    let receiver = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| async move {
            let request = ExportTraceServiceRequest::decode(body).expect("an OTLP/HTTP export");
            for spans in request.resource_spans {
                let attributes = spans.resource.map(|r| r.attributes).unwrap_or_default();
                for attribute in attributes {
                    if attribute.key == "service.name"
                        && let Some(Value::StringValue(name)) =
                            attribute.value.and_then(|v| v.value)
                    {
                        received.lock().unwrap().push(name);
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await });

    let database = test_support::test_database().await;
    let port = free_port();
    let mut command = Command::new(binary());
    command
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "info")
        .env("ORDERS_LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env("ORDERS_ADMIN_ADDR", "127.0.0.1:0")
        .env("DATABASE_URL", &database.url)
        .env("CATALOG_URL", "http://127.0.0.1:9");
    if let Some(name) = name {
        command.env("OTEL_SERVICE_NAME", name);
    }
    let mut orders = ServiceProcess::spawn(command, log_file("otel")).unwrap();
    let client = reqwest::Client::new();
    wait_until(
        "spans reach the receiver",
        Duration::from_secs(30),
        || async {
            let _ = client
                .get(format!("http://127.0.0.1:{port}/api/orders/1"))
                .send()
                .await;
            !names.lock().unwrap().is_empty()
        },
    )
    .await;
    orders.stop(Duration::from_secs(10));
    names.lock().unwrap().clone()
}

fn log_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orders-process-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}.log"))
}
