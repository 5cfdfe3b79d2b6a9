//! The HTTP API of orders-service.

mod health;
mod orders;
mod shipments;

use axum::extract::Request;
use axum::{Extension, Router, middleware};
use deadline_propagation::{DeadlineLayer, DeadlinePolicy};
use service_kit::openapi::{self, Ingress};
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::assistant;
use crate::budget::Budget;
use crate::config::Config;

/// Request bodies above this are refused with 413 before they are read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The document's frame; the paths come from the handlers (`routes!` below).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "orders-service",
        description = "Takes orders under the client's time budget (`X-Request-Timeout-Ms`): \
                       every step gets only what is left, and an order that cannot finish in \
                       time is answered 504 at once. The contract: docs/design.md §3.",
    ),
    tags(
        (name = "orders", description = "Placing and reading orders"),
        (name = "shipments", description = "Shipments booked through the queue to shipping-worker"),
        (name = "assistant", description = "An AI assistant's turn under tool budgets"),
        (name = "probes", description = "Liveness and readiness"),
    )
)]
struct ApiDoc;

/// The full router: API, assistant, MCP, health, metrics, and the OpenAPI document of
/// the public API at `GET /openapi.json`. `shutdown` ends MCP sessions.
///
/// The routes are served twice over: under the deadline layer (observe, propagate),
/// and, while the mode is legacy, round it, as a service without the technique serves
/// them. Each request takes the one its mode says when it arrives.
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
    let (routes, api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(orders::create_order))
        .routes(routes!(orders::get_order))
        .routes(routes!(shipments::create_shipment))
        .routes(routes!(shipments::get_shipment))
        .routes(routes!(assistant::chat::chat))
        .routes(routes!(health::readyz))
        .routes(routes!(health::healthz))
        .routes(routes!(health::dependencies))
        .split_for_parts();
    let document = openapi::serve(openapi::finish(api, Ingress::default()));
    let routes = routes
        .nest_service("/mcp", mcp)
        .route("/openapi.json", document)
        .with_state(state);
    let routes = service_kit::json::limit_bodies(routes, MAX_BODY_BYTES);
    let routes = service_kit::layers::catch_panics(routes);
    // Load balancers' probes are bounded, but their budgets are nobody's: not reported.
    let layer = DeadlineLayer::new(policy)
        .live_mode(mode.live())
        .server_timing_stages(config.server_timing_stages)
        .probes(["/healthz", "/readyz", "/health/dependencies"]);
    let legacy = routes.clone().layer(Extension(Budget::Unbounded));
    let legacy = deadline_propagation::measure(legacy, &metrics);
    let technique = deadline_propagation::instrument(routes, layer, &metrics);
    let by_mode = tower::service_fn(move |request: Request| {
        let router = match mode.is_legacy() {
            true => legacy.clone(),
            false => technique.clone(),
        };
        tower::ServiceExt::oneshot(router, request)
    });
    service_kit::layers::request_ids(Router::new().fallback_service(by_mode))
}
