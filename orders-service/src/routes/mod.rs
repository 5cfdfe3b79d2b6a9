//! The HTTP API of orders-service.

mod health;
mod orders;

use axum::routing::{get, post};
use axum::{Router, middleware};
use deadline_propagation::{DeadlineLayer, DeadlinePolicy};
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::assistant;
use crate::config::Config;

/// Request bodies above this are refused with 413 before they are read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The full router: API, assistant, MCP, health, metrics. `shutdown` ends MCP sessions.
pub fn router(config: &Config, state: AppState, shutdown: CancellationToken) -> Router {
    let policy = DeadlinePolicy::from_millis(config.deadline_max_ms, config.deadline_default_ms);
    let metrics = state.metrics.clone();
    let mode = state.mode.clone();
    let mcp = tower::ServiceBuilder::new()
        .layer(middleware::from_fn(assistant::mcp::refusals_as_problems))
        .layer(middleware::from_fn(assistant::mcp::watch_disconnect))
        .service(assistant::mcp::service(
            state.clone(),
            config.mcp_allowed_hosts.clone(),
            config.mcp_allowed_origins.clone(),
            shutdown,
        ));
    let routes = Router::new()
        .route("/api/orders", post(orders::create_order))
        .route("/api/assistant/chat", post(assistant::chat::chat))
        .nest_service("/mcp", mcp)
        .route("/api/orders/{id}", get(orders::get_order))
        .route("/readyz", get(health::readyz))
        .route("/healthz", get(health::healthz))
        .with_state(state);
    let routes = service_kit::json::limit_bodies(routes, MAX_BODY_BYTES);
    // Load balancers' probes are bounded, but their budgets are nobody's: not reported.
    let layer = DeadlineLayer::new(policy)
        .live_mode(mode)
        .probes(["/healthz", "/readyz"]);
    deadline_propagation::instrument(routes, layer, &metrics)
}
