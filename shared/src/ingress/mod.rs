//! The ingress layer: where a client's budget becomes a [`Deadline`](crate::Deadline).
//!
//! The mode (propagate, observe, legacy, and its run-time switch) is part of the
//! core, since every deadline carries one; the layer itself needs the `axum` feature.
//!
//! For every request it
//! 1. reads the budget headers (`X-Request-Timeout-Ms`, `grpc-timeout`,
//!    `x-envoy-expected-rq-timeout-ms`; the smallest wins) and answers a 400 problem
//!    naming the header that is malformed,
//! 2. clamps the budget to the service's maximum and counts the clamp,
//! 3. puts the `Deadline` into the request extensions (handlers take it as an argument),
//! 4. races the handler against the deadline and answers 504 `ingress` when it loses,
//! 5. adds `Server-Timing` with the stages the request went through.
//!
//! Like tower-http's middleware it *answers* (400, 504) instead of returning an error,
//! which would make hyper drop the connection, and it keeps the inner error type.
//!
//! Laid out like tower's `timeout`: `layer` holds the configuration, `service` does
//! the per-request work, `future` races the handler against the deadline.

#[cfg(feature = "axum")]
mod future;
#[cfg(feature = "axum")]
mod layer;
mod mode;
#[cfg(feature = "axum")]
mod service;

#[cfg(feature = "axum")]
pub use future::ResponseFuture;
#[cfg(feature = "axum")]
pub use layer::DeadlineLayer;
pub use mode::{DeadlineMode, LiveMode};
#[cfg(feature = "axum")]
pub use service::DeadlineService;

#[cfg(all(feature = "axum", feature = "metrics"))]
use crate::metrics::{Metrics, track_http};

/// Puts every route of `router` under `layer` (reporting to `metrics`), wraps that in
/// the HTTP metrics middleware, and adds `GET /metrics`: the one way both services
/// stack them.
///
/// Both are route layers, so both see the matched route (the `uri` label is the
/// template). The metrics middleware sits *outside* the deadline layer, so a request
/// cut at its deadline is still measured, with its 504.
#[cfg(all(feature = "axum", feature = "metrics"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "axum", feature = "metrics"))))]
pub fn instrument(router: axum::Router, layer: DeadlineLayer, metrics: &Metrics) -> axum::Router {
    router
        .route_layer(layer.metrics(metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            metrics.clone(),
            track_http,
        ))
        .merge(metrics.router())
}

/// The probe and scrape endpoints (docs/design.md §8). Load balancers and Prometheus call them
/// every few seconds with budgets of their own choosing; counted with the clients'
/// requests they would fill the deadline histograms with numbers that describe no
/// client. The ingress still bounds them, but reports none of their budget metrics.
pub(crate) const PROBE_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];
