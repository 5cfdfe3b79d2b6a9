//! tower-http's layers at the edge of each service.
//!
//! - [`request_ids`]: every request has an `x-request-id`, the client's own or a new
//!   UUID, and every answer carries it back (`SetRequestIdLayer`,
//!   `PropagateRequestIdLayer`).
//!
//! The body limits stay in [`json`](crate::json): tower-http's `RequestBodyLimitLayer`
//! answers a body announced too large with its own `text/plain` 413, not the contract's
//! problem.

use axum::Router;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

/// The header that names a request: the client's, or one made here.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Gives every request of `router` an `x-request-id`, and answers it back on every
/// response. A request that comes with one keeps it; any other gets a new UUID (v4).
/// Put it outermost, so every answer carries the id, the ingress's refusals and 404s
/// included.
///
/// ```
/// use axum::{Router, routing::get};
///
/// let app: Router = Router::new().route("/healthz", get(|| async { "ok" }));
/// let app = service_kit::layers::request_ids(app);
/// ```
pub fn request_ids<S>(router: Router<S>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    // The outer layer sets the id when the request has none; the inner one, which
    // then always finds it, copies it onto the answer.
    router
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
}
