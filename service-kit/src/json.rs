//! [`JsonBody`]: axum's `Json` extractor with its rejections turned into [`Problem`]s.
//!
//! axum already tells the cases apart; this only gives them the status codes the
//! contract promises (400 malformed, 415 wrong media type, 413 too large, 422 a value
//! that does not fit the schema) and a problem body instead of plain text.

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use serde::de::DeserializeOwned;

use crate::answers::Answers as _;
use deadline_propagation::Problem;

/// A JSON request body of type `T`, or a 4xx problem that says what was wrong.
///
/// ```
/// use axum::{Router, routing::post};
/// use deadline_propagation::Problem;
/// use service_kit::json::JsonBody;
///
/// #[derive(serde::Deserialize)]
/// struct Order {
///     sku: String,
///     quantity: u32,
/// }
///
/// // A body that is not JSON is 415, malformed 400, a wrong field 422: all problems.
/// async fn create(JsonBody(order): JsonBody<Order>) -> Result<String, Problem> {
///     Ok(format!("{} x {}", order.quantity, order.sku))
/// }
///
/// let app: Router = Router::new().route("/api/orders", post(create));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(problem_for(rejection)),
        }
    }
}

fn problem_for(rejection: JsonRejection) -> Problem {
    match rejection {
        JsonRejection::JsonDataError(err) => Problem::unprocessable(err.body_text()),
        JsonRejection::JsonSyntaxError(err) => Problem::bad_request(err.body_text()),
        JsonRejection::MissingJsonContentType(_) => {
            Problem::unsupported_media_type("expected a body with Content-Type: application/json")
        }
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Problem::payload_too_large("the request body is over the size limit")
        }
        other => Problem::bad_request(other.body_text()),
    }
}

/// Limits the request bodies of `router` to `max` bytes, with 413 problems.
///
/// A body found too large while it is read is refused by the extractor
/// ([`DefaultBodyLimit`]). A body whose `Content-Length` already says it is too large is
/// refused before a byte of it is read: otherwise a client that announces 10 MB and
/// sends nothing holds a worker until its deadline, and gets a 504 that blames the
/// server for the client's mistake.
///
/// ```
/// use axum::{Router, routing::post};
///
/// let app: Router = Router::new().route("/api/orders", post(|| async { "ok" }));
/// // An order is a few dozen bytes: refuse 64 KiB and more with 413.
/// let app = service_kit::json::limit_bodies(app, 64 * 1024);
/// ```
pub fn limit_bodies<S>(router: Router<S>, max: usize) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router
        .layer(DefaultBodyLimit::max(max))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            refuse_announced_oversize(max, request, next)
        }))
}

async fn refuse_announced_oversize(max: usize, request: Request, next: Next) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    match announced {
        Some(length) if length > max as u64 => Problem::payload_too_large(format!(
            "the request body is {length} bytes; at most {max} are accepted"
        ))
        .into_response(),
        _ => next.run(request).await,
    }
}
