//! Step 2 of the ladder, a budgeted call: the handler calls a downstream with what is
//! left of its budget, the downstream is told that budget in `X-Request-Timeout-Ms`,
//! and the wait for a pooled slot, the request and the body all end at the deadline.
//!
//! The example starts its own slow downstream (`inventory`, 1 s per answer) beside the
//! service, so it needs nothing else:
//!
//! ```sh
//! cargo run -p deadline-propagation --example client --features http-client
//! curl -i -H 'X-Request-Timeout-Ms: 300' localhost:3000/reserve   # 504 "inventory" after 300 ms
//! curl -i -H 'X-Request-Timeout-Ms: 1500' localhost:3000/reserve  # 200 after 1 s
//! ```

use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::{Router, routing::get};
use deadline_propagation::client::{BudgetedClient, ClientConfig};
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Downstream, Problem};
use tokio::net::TcpListener;

async fn reserve(
    State(inventory): State<BudgetedClient>,
    deadline: Deadline,
) -> Result<String, Problem> {
    let reply = inventory
        .request(axum::http::Method::GET, "/stock")
        .send(&deadline)
        .await?; // a `CallError` becomes the 503/504/502 that names `inventory`
    Ok(format!(
        "inventory: {}",
        String::from_utf8_lossy(&reply.body)
    ))
}

/// The downstream: 1 s per answer, and it says what budget it was given.
async fn stock(headers: HeaderMap) -> String {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let budget = headers.get("x-request-timeout-ms");
    format!("12 in stock (my budget was {budget:?} ms)\n")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let downstream = TcpListener::bind("127.0.0.1:0").await?;
    let base_url = format!("http://{}", downstream.local_addr()?);
    tokio::spawn(async move {
        axum::serve(downstream, Router::new().route("/stock", get(stock))).await
    });

    // The name gives its stages (`inventory_pool`, `inventory`) and labels its metrics;
    // the defaults are fields to change.
    let mut inventory = ClientConfig::new(Downstream::new("inventory")?, base_url);
    inventory.max_connections = 16; // in flight at once
    inventory.pending_max = 32; // waiting for a slot, then 503
    inventory.acquire_timeout = Duration::from_millis(40); // the longest wait for a slot
    inventory.reserve = Duration::from_millis(5); // kept to answer our own caller
    let inventory = BudgetedClient::new(inventory)?;
    let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(2000, 1000));
    let app = Router::new()
        .route("/reserve", get(reserve))
        .route_layer(layer)
        .with_state(inventory);
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
