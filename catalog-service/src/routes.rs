//! The public API: `GET /catalog/{sku}`, `/metrics`, `/healthz`.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Problem};

use crate::catalog::{self, Item};
use crate::config::Config;
use crate::faults::Faults;

/// The public router. The admin API is deliberately absent: it lives on its own port.
pub fn router(config: &Config, faults: Faults, metrics: Metrics) -> Router {
    let policy = DeadlinePolicy::from_millis(config.deadline_max_ms, config.deadline_default_ms);
    let routes = Router::new()
        .route("/catalog/{sku}", get(get_item))
        .with_state(faults)
        .route("/healthz", get(|| async { "ok" }));
    // The public API takes no bodies at all.
    let routes = service_kit::json::limit_bodies(routes, 1024);
    // When orders-service observes, the catalog observes that call too instead of
    // refusing it (docs/design.md §4.3), unless CATALOG_HONOUR_OBSERVE is off.
    let layer = DeadlineLayer::new(policy)
        .honour_mode_header(config.honour_observe)
        .probes(["/healthz"]);
    deadline_propagation::instrument(routes, layer, &metrics)
}

/// One catalog item, after the injected faults.
async fn get_item(
    State(faults): State<Faults>,
    _deadline: Deadline,
    Path(sku): Path<String>,
) -> Result<Json<Item>, Problem> {
    faults.inject().await?;
    catalog::lookup(&sku)
        .map(Json)
        .ok_or_else(|| Problem::not_found(format!("no catalog item {sku:?}")))
}
