//! The HTTP API of orders-service.

mod health;
mod orders;

use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{Router, middleware};
use shared::metrics::track_http;
use shared::{DeadlineLayer, DeadlinePolicy};
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::assistant;
use crate::config::Config;

/// Request bodies above this are refused with 413 before they are read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The full router: API, assistant, MCP, health, metrics. `shutdown` ends MCP sessions.
pub fn router(config: &Config, state: AppState, shutdown: CancellationToken) -> Router {
    let policy = DeadlinePolicy::new(
        Duration::from_millis(config.deadline_max_ms),
        Duration::from_millis(config.deadline_default_ms),
    );
    let metrics = state.metrics.clone();
    let mcp = tower::ServiceBuilder::new()
        .layer(middleware::from_fn(assistant::mcp::watch_disconnect))
        .service(assistant::mcp::service(
            state.clone(),
            config.mcp_allowed_hosts.clone(),
            shutdown,
        ));
    Router::new()
        .route("/api/orders", post(orders::create_order))
        .route("/api/assistant/chat", post(assistant::chat::chat))
        .nest_service("/mcp", mcp)
        .route("/api/orders/{id}", get(orders::get_order))
        .route("/readyz", get(health::readyz))
        .route("/healthz", get(health::healthz))
        .with_state(state)
        // route_layer: both see the matched route; metrics sit outside the deadline so
        // requests cut at their deadline are measured too.
        .route_layer(
            DeadlineLayer::new(policy)
                .mode(config.deadline_mode)
                .metrics(metrics.deadline().clone()),
        )
        .route_layer(middleware::from_fn_with_state(metrics.clone(), track_http))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .merge(metrics.router())
}
