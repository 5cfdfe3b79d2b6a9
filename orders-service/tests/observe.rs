//! Observe mode, end to end: orders-service observes, the catalog runs as it starts by
//! default, and nothing in the chain refuses because of a budget the edge only watches;
//! every hop counts what propagate would have refused. Then the switch to propagate.

mod common;

use common::{MS, TestApp, json_of, spawn_app_with};
use orders_service::Mode;
use reqwest::StatusCode;
use serde_json::json;
use test_support::metric_value;
use tokio::time::Instant;

const SKU: &str = "SKU-00042";
const CATALOG_DELAY_MS: u64 = 600;
const BUDGET_MS: u64 = 300;

/// `deadline_would_refuse_total` of `service` in `stage` for `reason`, as its `/metrics`
/// shows it over HTTP.
async fn would_refuse(app: &TestApp, base: &str, service: &str, stage: &str, reason: &str) -> f64 {
    let labels = format!(r#"service="{service}",stage="{stage}",reason="{reason}""#);
    metric_value(
        &app.scrape(base).await,
        "deadline_would_refuse_total",
        &labels,
    )
    .unwrap_or(0.0)
}

async fn timed_order(app: &TestApp) -> (StatusCode, std::time::Duration, serde_json::Value) {
    let started = Instant::now();
    let response = app
        .post_order(json!({"sku": SKU, "quantity": 1}), Some(BUDGET_MS), None)
        .await;
    let took = started.elapsed();
    let status = response.status();
    (status, took, json_of(response).await)
}

#[tokio::test]
async fn observe_refuses_nowhere_in_the_chain_counts_at_every_hop_and_propagate_then_enforces() {
    let app = spawn_app_with(|c| c.deadline_mode = Mode::Observe).await;
    app.slow_catalog(CATALOG_DELAY_MS);
    let catalog = app.catalog_url.clone();

    // Observe: the order waits for the catalog and is written, later than its budget.
    let (status, took, body) = timed_order(&app).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(took >= MS(CATALOG_DELAY_MS), "answered after {took:?}");
    assert!(
        took < MS(CATALOG_DELAY_MS + 1000),
        "answered after {took:?}: near the catalog's {CATALOG_DELAY_MS} ms"
    );
    // Each hop counted the 504 propagate would have answered: orders at its ingress and
    // for its catalog call, the catalog at its own ingress.
    let orders = app.base.clone();
    for stage in ["ingress", "catalog"] {
        let counted = would_refuse(&app, &orders, "orders-service", stage, "deadline").await;
        assert!(counted >= 1.0, "orders-service {stage}: {counted}");
    }
    let counted = would_refuse(&app, &catalog, "catalog-service", "ingress", "deadline").await;
    assert!(counted >= 1.0, "catalog-service ingress: {counted}");

    // Propagate, switched through the admin API: the same order is a 504 within the budget.
    app.switch_mode("propagate").await;
    let rows = app.order_rows().await;
    let (status, took, body) = timed_order(&app).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["stage"], "catalog", "{body}");
    // The deadline fires at the budget; what comes after is one hop building a 504.
    assert!(took < MS(BUDGET_MS + 200), "answered after {took:?}");
    assert_eq!(app.order_rows().await, rows, "nothing written");
}

/// A client of the edge cannot ask for observe: orders-service honours no marker, so a
/// caller's `X-Deadline-Mode` changes nothing there.
#[tokio::test]
async fn the_edge_does_not_let_its_clients_switch_enforcement_off() {
    let app = spawn_app_with(|_| {}).await;
    app.slow_catalog(CATALOG_DELAY_MS);
    let response = app
        .client
        .post(format!("{}/api/orders", app.base))
        .header("X-Request-Timeout-Ms", BUDGET_MS)
        .header("X-Deadline-Mode", "observe")
        .json(&json!({"sku": SKU, "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
}
