//! The orders API: success, idempotency, bad input, consistency, and the server's limits.

mod common;

use std::time::Duration;

use common::{MS, json_of, spawn_app, spawn_app_with};
use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::json;
use test_support::{metric_value, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

#[tokio::test]
async fn an_order_is_created_priced_and_readable() {
    let app = spawn_app().await;
    let before = app.stock("SKU-00042").await;
    let response = app.order("SKU-00042", 3, Some(1000)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let timing = response.headers()["server-timing"]
        .to_str()
        .unwrap()
        .to_owned();
    let order = json_of(response).await;
    let price = catalog_service::catalog::lookup("SKU-00042")
        .unwrap()
        .price_cents;
    assert_eq!(order["sku"], "SKU-00042");
    assert_eq!(order["quantity"], 3);
    assert_eq!(order["unit_price_cents"], price);
    assert_eq!(order["total_cents"], 3 * price);
    assert_eq!(location, format!("/api/orders/{}", order["id"]));
    for stage in ["catalog_pool;", "catalog;", "db_pool;", "db;", "total;"] {
        assert!(timing.contains(stage), "{stage} missing from {timing}");
    }
    assert_eq!(app.stock("SKU-00042").await, before - 3);

    let read = app.get(&location).await;
    assert_eq!(read.status(), StatusCode::OK);
    // A read answers before its ROLLBACK; the time it spent must still be in the header.
    let timing = read.headers()["server-timing"].to_str().unwrap().to_owned();
    for stage in ["db_pool;", "db;", "total;"] {
        assert!(
            timing.contains(stage),
            "{stage} missing from the read's {timing}"
        );
    }
    assert_eq!(json_of(read).await, order);
}

/// At a public edge the stages of `Server-Timing` name the downstreams and time the
/// database for every client: with `SERVER_TIMING_STAGES=false` only `total` is said,
/// on answers and refusals alike.
#[tokio::test]
async fn server_timing_says_only_the_total_where_the_stages_are_turned_off() {
    let app = spawn_app_with(|c| c.server_timing_stages = false).await;
    let created = app.order("SKU-00043", 1, Some(1000)).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let refused = app.order("SKU-00043", 1, Some(0)).await;
    assert_eq!(refused.status(), StatusCode::GATEWAY_TIMEOUT);
    for response in [created, refused] {
        let timing = response.headers()["server-timing"].to_str().unwrap();
        assert!(timing.starts_with("total;dur="), "{timing}");
        assert!(!timing.contains(','), "one entry only: {timing}");
    }
}

#[tokio::test]
async fn an_unknown_order_id_is_a_404_problem() {
    let app = spawn_app().await;
    for id in ["999999", "abc", "-1", "99999999999999999999999"] {
        let response = app.get(&format!("/api/orders/{id}")).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{id}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
}

#[tokio::test]
async fn the_same_key_and_body_returns_the_original_order() {
    let app = spawn_app().await;
    let body = json!({"sku": "SKU-00005", "quantity": 1});
    let first = json_of(app.post_order(body.clone(), None, Some("k-1")).await).await;
    let again = app.post_order(body, None, Some("k-1")).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(json_of(again).await["id"], first["id"]);
    assert_eq!(app.order_rows().await, 1);
}

#[tokio::test]
async fn the_same_key_with_a_different_body_is_a_422() {
    let app = spawn_app().await;
    let first = app
        .post_order(
            json!({"sku": "SKU-00005", "quantity": 1}),
            None,
            Some("k-2"),
        )
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let other = app
        .post_order(
            json!({"sku": "SKU-00005", "quantity": 2}),
            None,
            Some("k-2"),
        )
        .await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        json_of(other).await["detail"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key")
    );
    assert_eq!(app.order_rows().await, 1);
}

#[tokio::test]
async fn bad_input_gets_the_documented_4xx_and_writes_nothing() {
    let app = spawn_app().await;
    let url = format!("{}/api/orders", app.base);
    let json_body = |body: &str| {
        app.client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_owned())
    };
    let cases = [
        (
            "malformed JSON",
            json_body("{\"sku\":"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "not an object",
            json_body("[1,2]"),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "missing sku",
            json_body(r#"{"quantity":1}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "missing quantity",
            json_body(r#"{"sku":"SKU-00001"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "quantity 0",
            json_body(r#"{"sku":"SKU-00001","quantity":0}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "quantity -1",
            json_body(r#"{"sku":"SKU-00001","quantity":-1}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "quantity huge",
            json_body(r#"{"sku":"SKU-00001","quantity":1e300}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "quantity text",
            json_body(r#"{"sku":"SKU-00001","quantity":"2"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "unknown sku",
            json_body(r#"{"sku":"SKU-99999","quantity":1}"#),
            StatusCode::NOT_FOUND,
        ),
        (
            "path in sku",
            json_body(r#"{"sku":"../admin","quantity":1}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "not JSON",
            app.client
                .post(&url)
                .header("content-type", "text/plain")
                .body("sku=1"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "bad budget",
            json_body(r#"{"sku":"SKU-00001","quantity":1}"#).header("X-Request-Timeout-Ms", "1e3"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "bad key",
            json_body(r#"{"sku":"SKU-00001","quantity":1}"#).header("Idempotency-Key", "has space"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "over 64 KiB",
            json_body(&format!(
                r#"{{"sku":"SKU-00001","quantity":1,"pad":"{}"}}"#,
                "x".repeat(70_000)
            )),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (name, request, expected) in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), expected, "{name}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{name}"
        );
        let problem = json_of(response).await;
        assert!(
            !problem["detail"].as_str().unwrap_or_default().is_empty(),
            "{name}"
        );
    }
    assert_eq!(app.order_rows().await, 0);
}

#[tokio::test]
async fn a_client_announcing_a_10_mb_body_gets_a_413_before_sending_it() {
    // Raw TCP, so the answer is read whatever the server does with the connection after
    // it: a client library that is still sending 10 MB when the 413 arrives may only see
    // a reset, and a test that accepted that could not tell a 413 from a crash.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app().await;
    let mut stream = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /api/orders HTTP/1.1\r\nhost: orders\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        10 << 20
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(MS(2000), async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&answer).contains("\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "closed without an answer");
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(read.is_ok(), "no answer while the body was still unsent");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert_eq!(app.order_rows().await, 0);
}

#[tokio::test]
async fn orders_stay_consistent_under_jitter_and_tight_budgets() {
    let app = spawn_app().await;
    app.faults.set(catalog_service::FaultConfig {
        delay_ms: 0,
        jitter_ms: 150,
        error_rate: 0.1,
        ..catalog_service::FaultConfig::default()
    });
    let skus = ["SKU-00100", "SKU-00101", "SKU-00102"];
    let mut initial = Vec::new();
    for sku in skus {
        initial.push(app.stock(sku).await);
    }
    let mut created = Vec::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for round in 0..6u64 {
        let calls = (0..10u64).map(|i| {
            let sku = skus[(i % 3) as usize];
            let budget = 40 + (round * 10 + i) * 7 % 200;
            let app = &app;
            async move { app.order(sku, 1 + (i % 3) as i64, Some(budget)).await }
        });
        for response in join_all(calls).await {
            let status = response.status();
            *statuses.entry(status.as_u16()).or_default() += 1;
            let body = json_of(response).await;
            assert!(
                [201, 502, 503, 504].contains(&status.as_u16()),
                "unexpected {status}: {body}"
            );
            if status == StatusCode::CREATED {
                created.push(body["id"].as_i64().unwrap());
            }
        }
    }
    assert!(
        statuses.contains_key(&201) && statuses.contains_key(&504),
        "{statuses:?}"
    );
    // Every 201 has exactly one row, and no other answer (504, 503, 502) left one: once
    // nothing runs on the server, the table holds the 201s and nothing else.
    test_support::wait_until("the service runs no statement", MS(3000), || async {
        app.service_statements_in_flight().await == 0
    })
    .await;
    assert_eq!(
        app.order_rows().await,
        created.len() as i64,
        "rows beyond the 201s: {statuses:?}"
    );
    for id in &created {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = $1")
            .bind(id)
            .fetch_one(&app.side)
            .await
            .unwrap();
        assert_eq!(rows, 1, "order {id}");
    }
    // Stock moved by exactly the committed quantities.
    for (sku, before) in skus.iter().zip(initial) {
        let committed: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(quantity), 0)::bigint FROM orders WHERE sku = $1",
        )
        .bind(sku)
        .fetch_one(&app.side)
        .await
        .unwrap();
        assert_eq!(app.stock(sku).await, before - committed, "{sku}");
    }
    common::wait_for_idle_pool(&app).await;
}

/// JSON has one number type: `384.0` and `1e1` are whole numbers, and the OpenAPI
/// document's `"type": "integer"` (JSON Schema) accepts them, so the service does too
/// (schemathesis sent `384.0` and got 422). A fraction is still refused.
#[tokio::test]
async fn a_whole_number_written_with_a_fraction_or_exponent_is_a_quantity() {
    let app = spawn_app().await;
    let url = format!("{}/api/orders", app.base);
    let order = |quantity: &str| {
        app.client
            .post(&url)
            .header("content-type", "application/json")
            .body(format!(r#"{{"sku":"SKU-00300","quantity":{quantity}}}"#))
            .send()
    };
    let before = app.stock("SKU-00300").await;
    for (quantity, taken) in [("2.0", 2), ("1e1", 10), ("3E0", 3)] {
        let response = order(quantity).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::CREATED,
            "quantity {quantity}"
        );
        assert_eq!(
            json_of(response).await["quantity"],
            taken,
            "quantity {quantity}"
        );
    }
    assert_eq!(app.stock("SKU-00300").await, before - 15);
    for quantity in ["2.5", "1e-1", "1000.5", "1e4"] {
        let response = order(quantity).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "quantity {quantity}"
        );
    }
    assert_eq!(app.stock("SKU-00300").await, before - 15);
}

#[tokio::test]
async fn not_enough_stock_is_a_409_and_changes_nothing() {
    let app = spawn_app().await;
    sqlx::query("UPDATE inventory SET available = 2 WHERE sku = 'SKU-00200'")
        .execute(&app.side)
        .await
        .unwrap();
    let response = app.order("SKU-00200", 3, None).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(app.stock("SKU-00200").await, 2);
    assert_eq!(app.order_rows().await, 0);
}

/// A catalog outage does not make orders-service unready: it still serves, answering
/// orders at once with the contract's 502 naming the catalog and reading orders from
/// PostgreSQL. The outage shows where people and Prometheus look instead.
#[tokio::test]
async fn with_the_catalog_stopped_the_service_stays_ready_and_answers_in_budget() {
    let mut app = spawn_app_with(|c| c.dependency_check_every_ms = 200).await;
    let created = app.order("SKU-00001", 1, None).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let id = json_of(created).await["id"].as_i64().expect("an order id");
    let ready = app.get("/health/dependencies").await;
    assert_eq!(json_of(ready).await["status"], "ok");

    app.stop_catalog().await;
    for _ in 0..10 {
        let ready = app.get("/readyz").await;
        assert_eq!(
            ready.status(),
            StatusCode::OK,
            "ready with the catalog gone"
        );
    }
    let started = Instant::now();
    let order = app.order("SKU-00002", 1, Some(700)).await;
    assert_eq!(order.status(), StatusCode::BAD_GATEWAY);
    assert!(started.elapsed() < MS(700), "took {:?}", started.elapsed());
    assert_eq!(json_of(order).await["stage"], "catalog");
    let read = app.get(&format!("/api/orders/{id}")).await;
    assert_eq!(
        read.status(),
        StatusCode::OK,
        "an order is read from PostgreSQL alone"
    );

    // The background check tells Prometheus within its period.
    let up = |dependency| format!(r#"service="orders-service",dependency="{dependency}""#);
    wait_until("the catalog's gauge at 0", MS(3000), || async {
        let exposition = app.scrape(&app.base).await;
        metric_value(&exposition, "dependency_up", &up("catalog")) == Some(0.0)
    })
    .await;
    let exposition = app.scrape(&app.base).await;
    assert_eq!(
        metric_value(&exposition, "dependency_up", &up("database")),
        Some(1.0)
    );
    let report = json_of(app.get("/health/dependencies").await).await;
    assert_eq!(report["status"], "degraded", "{report}");
    assert_eq!(report["database"], "ok", "{report}");
    assert_ne!(report["catalog"], "ok", "{report}");
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_client_that_sends_its_headers_too_slowly_is_dropped() {
    let app = spawn_app_with(|c| c.header_read_timeout_ms = 200).await;
    let addr = app.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /api/orders HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    // The server closes the connection (possibly after a 408); read until it does.
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection was still open after 3 s");
    assert!(
        started.elapsed() < MS(1500),
        "closed after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn shutdown_drains_in_flight_orders() {
    let mut app = spawn_app().await;
    app.slow_catalog(300);
    let url = format!("{}/api/orders", app.base);
    let request = tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&json!({"sku": "SKU-00001", "quantity": 1}))
            .send()
            .await
            .map(|r| r.status())
    });
    test_support::wait_until("the order is in flight", MS(2000), || async {
        app.catalog_budgets.lock().unwrap().len() == 1
    })
    .await;
    app.shutdown().await;
    assert_eq!(request.await.unwrap().unwrap(), StatusCode::CREATED);
    assert_eq!(app.order_rows().await, 1);
}

#[test]
fn an_invalid_setting_stops_start_up_with_a_message_naming_the_variable() {
    for (variable, value) in [
        ("DEADLINE_MODE", "fast"),
        ("CATALOG_POOL_MAX_CONNECTIONS", "0"),
        ("DEADLINE_MAX_MS", "-1"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_orders-service"))
            .env(variable, value)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{variable}={value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(variable), "{variable}: {stderr}");
    }
}
