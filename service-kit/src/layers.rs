//! tower-http's layers at the edge of each service: request ids and panics.
//!
//! - [`request_ids`]: every request has an `x-request-id`, the client's own or a new
//!   UUID, and every answer carries it back (`SetRequestIdLayer`,
//!   `PropagateRequestIdLayer`).
//! - [`catch_panics`]: a handler that panics is answered 500 `urn:problem:internal`
//!   as [`Problem::internal`] writes it (`CatchPanicLayer`); the panic's text goes to
//!   the log, never to the client.
//!
//! The body limits stay in [`json`](crate::json): tower-http's `RequestBodyLimitLayer`
//! answers a body announced too large with its own `text/plain` 413, not the contract's
//! problem.

use std::any::Any;

use axum::Router;
use axum::response::{IntoResponse, Response};
use deadline_propagation::Problem;
use tower_http::catch_panic::CatchPanicLayer;
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

/// Answers a panic in `router`'s handlers with 500 `urn:problem:internal` instead of
/// dropping the connection. Put it inside the deadline layer and the metrics, so the
/// answer carries `Server-Timing`, is counted, and its cause (the panic's text) logged
/// like any other 500.
///
/// ```
/// use axum::{Router, routing::get};
///
/// let app: Router = Router::new().route("/", get(|| async { "ok" }));
/// let app = service_kit::layers::catch_panics(app);
/// ```
pub fn catch_panics<S>(router: Router<S>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router.layer(CatchPanicLayer::custom(panic_answer))
}

fn panic_answer(panic: Box<dyn Any + Send + 'static>) -> Response {
    let text = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => text,
        (None, Some(text)) => text.as_str(),
        (None, None) => "a panic without a message",
    };
    Problem::internal(format!("the handler panicked: {text}")).into_response()
}
