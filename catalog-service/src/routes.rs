//! The public API: `GET /catalog/{sku}`, `/metrics`, `/healthz`.

use axum::extract::{Path, State};
use axum::{Json, Router};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Problem};
use service_kit::openapi::{self, Ingress, ProblemDetails};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::catalog::{self, Item};
use crate::config::Config;
use crate::pricing::Pricing;
use service_kit::faults::Faults;

/// The document's frame; the paths come from the handlers (`routes!` below).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "catalog-service",
        description = "The downstream of orders-service: one catalog item per SKU, under the \
                       caller's time budget (`X-Request-Timeout-Ms`). Faults are injected \
                       through the admin API, which is not part of this document.",
    ),
    tags(
        (name = "catalog", description = "Catalog items"),
        (name = "probes", description = "Liveness"),
    )
)]
struct ApiDoc;

/// The public router, with its OpenAPI document at `GET /openapi.json`. The admin API is
/// deliberately absent: it lives on its own port.
pub fn router(
    config: &Config,
    faults: Faults,
    pricing: Option<Pricing>,
    metrics: Metrics,
) -> Router {
    let policy = DeadlinePolicy::from_millis(config.deadline_max_ms, config.deadline_default_ms);
    let (routes, api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(get_item))
        .routes(routes!(healthz))
        .split_for_parts();
    let ingress = Ingress {
        mode_header: config.honour_observe,
    };
    let routes = routes
        .route(
            "/openapi.json",
            openapi::serve(openapi::finish(api, ingress)),
        )
        .with_state(Handler { faults, pricing });
    // The public API takes no bodies at all.
    let routes = service_kit::json::limit_bodies(routes, 1024);
    let routes = service_kit::layers::catch_panics(routes);
    // When orders-service observes, the catalog observes that call too instead of
    // refusing it (docs/design.md §4.3), unless CATALOG_HONOUR_OBSERVE is off.
    let layer = DeadlineLayer::new(policy)
        .honour_mode_header(config.honour_observe)
        .probes(["/healthz"]);
    let routes = deadline_propagation::instrument(routes, layer, &metrics);
    service_kit::layers::request_ids(routes)
}

/// What the item handler uses.
#[derive(Clone)]
struct Handler {
    faults: Faults,
    pricing: Option<Pricing>,
}

/// One catalog item, after the injected faults, priced by pricing-service when
/// `PRICING_URL` is set.
#[utoipa::path(
    get,
    path = "/catalog/{sku}",
    tag = "catalog",
    summary = "One catalog item",
    params(("sku" = String, Path, example = "SKU-00042",
            description = "`SKU-00001` to `SKU-01000`; anything else is 404")),
    responses(
        (status = 200, description = "The item", body = Item),
        (status = 404, description = "No such SKU", body = ProblemDetails),
        (status = 500, description = "An injected fault (`error_rate` or `panic_rate`, admin API): `urn:problem:internal`", body = ProblemDetails),
        (status = 502, description = "pricing-service answered an unexpected gRPC status (stage `pricing`)", body = ProblemDetails),
        (status = 503, description = "An injected refusal (`unavailable_rate`, admin API), before any work, or pricing-service `UNAVAILABLE` (stage `pricing`)", body = ProblemDetails),
    )
)]
async fn get_item(
    State(handler): State<Handler>,
    deadline: Deadline,
    Path(sku): Path<String>,
) -> Result<Json<Item>, Problem> {
    handler.faults.inject().await?;
    let mut item = catalog::lookup(&sku)
        .ok_or_else(|| Problem::not_found(format!("no catalog item {sku:?}")))?;
    if let Some(pricing) = &handler.pricing {
        item.price_cents = pricing
            .price(&item.sku, item.price_cents, &deadline)
            .await?;
    }
    Ok(Json(item))
}

/// 200 while the process runs.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "probes",
    responses((status = 200, description = "The process runs", body = String, content_type = "text/plain"))
)]
async fn healthz() -> &'static str {
    "ok"
}
