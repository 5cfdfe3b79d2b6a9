//! Prechecks (`ORDERS_PRECHECKS`): a downstream added by configuration only, over real
//! HTTP, with the orders table as the system of record for "nothing was written".

mod common;

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::post;
use common::{MS, TestApp, json_of, spawn_app_with};
use orders_service::config::parse_spec;
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::{Running, metric_value};
use tokio::time::Instant;

/// Every check the precheck server received: its body and its budget header.
type Seen = Arc<Mutex<Vec<(Value, Option<u64>)>>>;

/// A check server: `/slow` answers after 30 s (far past any budget here); `/moved`
/// answers 303 to a place nothing listens on; `/check` decides by quantity: 13 is
/// refused (409), 14 is invalid (422), 15 is overloaded (503, `Retry-After: 7`), the rest
/// pass.
async fn spawn_check_server() -> (String, Seen, Running) {
    let seen: Seen = Arc::default();
    let record = {
        let seen = Arc::clone(&seen);
        move |headers: &HeaderMap, body: &Value| {
            let budget = headers
                .get("x-request-timeout-ms")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            seen.lock().unwrap().push((body.clone(), budget));
        }
    };
    let slow = {
        let record = record.clone();
        move |headers: HeaderMap, Json(body): Json<Value>| async move {
            record(&headers, &body);
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            AxumStatus::OK
        }
    };
    let moved = {
        let record = record.clone();
        move |headers: HeaderMap, Json(body): Json<Value>| async move {
            record(&headers, &body);
            // Port 9 (discard) on loopback: nothing listens there in a test.
            (
                AxumStatus::SEE_OTHER,
                [("location", "http://127.0.0.1:9/elsewhere")],
            )
        }
    };
    let check = move |headers: HeaderMap, Json(body): Json<Value>| async move {
        record(&headers, &body);
        let status = match body["quantity"].as_i64() {
            Some(13) => AxumStatus::CONFLICT,
            Some(14) => AxumStatus::UNPROCESSABLE_ENTITY,
            Some(15) => AxumStatus::SERVICE_UNAVAILABLE,
            _ => AxumStatus::NO_CONTENT,
        };
        (status, [("retry-after", "7")])
    };
    let router = Router::new()
        .route("/slow", post(slow))
        .route("/moved", post(moved))
        .route("/check", post(check));
    let (url, running) = common::serve(router).await;
    (url, seen, running)
}

async fn app_with_precheck(spec: &str) -> TestApp {
    let spec = parse_spec(spec).expect("a valid precheck");
    spawn_app_with(move |c| c.prechecks = vec![spec]).await
}

#[tokio::test]
async fn a_slow_precheck_answers_504_in_its_own_stage_and_writes_nothing() {
    let (url, seen, _checks) = spawn_check_server().await;
    let app = app_with_precheck(&format!("fraud={url}/slow")).await;
    let stock_before = app.stock("SKU-00003").await;

    let started = Instant::now();
    let response = app.order("SKU-00003", 2, Some(300)).await;
    let took = started.elapsed();

    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    // The budget is 300 ms; the bound leaves room for a loaded 2-core machine while
    // still far below the check's 30 s.
    assert!(
        took >= MS(290) && took < MS(1500),
        "answered after {took:?}"
    );
    let timing = response.headers()["server-timing"]
        .to_str()
        .unwrap()
        .to_owned();
    let problem = json_of(response).await;
    assert_eq!(problem["stage"], "fraud", "{problem}");
    assert_eq!(problem["budget_ms"], 300);
    assert!(timing.contains("fraud;dur="), "{timing}");
    assert!(
        timing.contains("catalog;dur="),
        "the catalog ran first: {timing}"
    );

    // The check was really asked, with the order and less budget than the client's.
    let asked = seen.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].0, json!({"sku": "SKU-00003", "quantity": 2}));
    assert!(asked[0].1.is_some_and(|ms| ms > 0 && ms < 300), "{asked:?}");

    // The system of record: no order row, no stock taken.
    assert_eq!(app.order_rows_for("SKU-00003").await, 0);
    assert_eq!(app.stock("SKU-00003").await, stock_before);

    let text = app.scrape(&app.base).await;
    let exceeded = metric_value(
        &text,
        "deadline_exceeded_total",
        r#"service="orders-service",stage="fraud""#,
    );
    assert_eq!(exceeded, Some(1.0), "{text}");
    let timeouts = metric_value(
        &text,
        "http_client_requests_seconds_count",
        r#"client="fraud",status="timeout""#,
    );
    assert_eq!(timeouts, Some(1.0));
    let limit = metric_value(
        &text,
        "http_client_pool_limit",
        r#"client="fraud",kind="max_connections""#,
    );
    assert_eq!(limit, Some(50.0), "the catalog's pool settings by default");
}

#[tokio::test]
async fn a_passing_precheck_lets_the_order_through_and_a_refusing_one_writes_nothing() {
    let (url, seen, _checks) = spawn_check_server().await;
    let app = app_with_precheck(&format!("fraud={url}/check")).await;

    let response = app.order("SKU-00004", 3, Some(800)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let order = json_of(response).await;
    assert_eq!(order["quantity"], 3);
    assert_eq!(app.order_rows_for("SKU-00004").await, 1);
    let (body, budget) = seen.lock().unwrap()[0].clone();
    assert_eq!(body, json!({"sku": "SKU-00004", "quantity": 3}));
    assert!(budget.is_some_and(|ms| ms > 0 && ms < 800), "{budget:?}");

    for (sku, quantity, status, kind) in [
        (
            "SKU-00005",
            13,
            StatusCode::CONFLICT,
            "urn:problem:conflict",
        ),
        (
            "SKU-00006",
            14,
            StatusCode::UNPROCESSABLE_ENTITY,
            "urn:problem:validation",
        ),
    ] {
        let stock_before = app.stock(sku).await;
        let response = app.order(sku, quantity, Some(800)).await;
        assert_eq!(response.status(), status, "quantity {quantity}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem = json_of(response).await;
        assert_eq!(problem["type"], kind, "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("fraud"),
            "{problem}"
        );
        assert_eq!(app.order_rows_for(sku).await, 0, "{sku}");
        assert_eq!(app.stock(sku).await, stock_before, "{sku}");
    }
    // An overloaded check is passed on as the catalog's 503 would be.
    let response = app.order("SKU-00007", 15, Some(800)).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "7");
    let problem = json_of(response).await;
    assert_eq!(problem["stage"], "fraud", "{problem}");
    assert_eq!(app.order_rows_for("SKU-00007").await, 0);
    assert_eq!(seen.lock().unwrap().len(), 4, "one check per order");
}

#[tokio::test]
async fn without_prechecks_the_only_client_is_the_catalog() {
    let app = spawn_app_with(|_| {}).await;
    assert!(app.state.prechecks.names().is_empty());
    let response = app.order("SKU-00008", 1, Some(800)).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let samples = test_support::exposition::parse(&app.metrics());
    let clients: std::collections::BTreeSet<_> =
        samples.iter().filter_map(|s| s.label("client")).collect();
    assert_eq!(clients.into_iter().collect::<Vec<_>>(), ["catalog"]);
}

#[tokio::test]
async fn a_redirecting_precheck_is_asked_once_and_its_answer_is_not_followed() {
    let (url, seen, _checks) = spawn_check_server().await;
    let app = app_with_precheck(&format!("fraud={url}/moved")).await;
    let rows_before = app.order_rows().await;

    let response = app.order("SKU-00005", 1, Some(1000)).await;

    // A 3xx is the check's answer, not an instruction to a budgeted client: following it
    // would send the order somewhere else, and a failure there looks like a refused
    // connection, which is retried: the check would be asked twice for one order.
    assert_eq!(seen.lock().unwrap().len(), 1, "the check was asked once");
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let problem = json_of(response).await;
    assert_eq!(problem["stage"], "fraud", "{problem}");
    assert_eq!(app.order_rows().await, rows_before, "nothing written");
}
