//! `POST /api/orders` and `GET /api/orders/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use deadline_propagation::Problem;
use service_kit::json::JsonBody;
use service_kit::openapi::ProblemDetails;

use crate::AppState;
use crate::budget::Budget;
use crate::orders::{self, NewOrderRequest, Order, Placed};

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Validates, answers a replay from the table, prices the order through the catalog,
/// asks the configured prechecks, and places it: each step under what is left of the
/// request's budget.
#[utoipa::path(
    post,
    path = "/api/orders",
    tag = "orders",
    summary = "Place an order",
    description = "Prices the order through catalog-service, then writes the order and its \
                   stock decrement in one transaction, each step under what is left of the \
                   request's budget.",
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
         pattern = "^[!-~]+$",
         description = "The same key and body return the first order (`Idempotent-Replayed: \
                        true`), even for concurrent retries. After a 500 \
                        `urn:problem:outcome-unknown`, retry with the same key to learn the outcome."),
    ),
    request_body(content = NewOrderRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The order and its stock decrement are committed", body = Order,
         headers(
             ("Location" = String, description = "The order's URL, `/api/orders/{id}`"),
             ("Idempotent-Replayed" = String, description = "`true` when this is the first order of an earlier request with the same key"),
         )),
        (status = 400, description = "A malformed `Idempotency-Key` (`urn:problem:invalid-header`). Nothing was written", body = ProblemDetails),
        (status = 404, description = "No such SKU in the catalog. Nothing was written", body = ProblemDetails),
        (status = 409, description = "Not enough stock. Nothing was written", body = ProblemDetails),
        (status = 422, description = "A field missing or out of range, or an `Idempotency-Key` reused for a different order. Nothing was written", body = ProblemDetails),
        (status = 500, description = "`urn:problem:outcome-unknown`: a step that may have taken effect (the COMMIT, or a downstream that answered its own outcome-unknown) had an outcome not learned within 250 ms past the deadline; retry with the same `Idempotency-Key` to learn it (`urn:problem:internal` is a bug)", body = ProblemDetails),
        (status = 502, description = "The catalog or a precheck failed. Nothing was written", body = ProblemDetails),
        (status = 503, description = "Refused before any work: a full pool queue, a slot not free within the early-rejection threshold, a catalog call the recent latency says cannot finish in time, or the database down. Nothing was written", body = ProblemDetails),
    )
)]
pub(super) async fn create_order(
    State(state): State<AppState>,
    budget: Budget,
    headers: HeaderMap,
    JsonBody(request): JsonBody<NewOrderRequest>,
) -> Result<Response, Problem> {
    let order = request.validate()?;
    let key = headers
        .get(IDEMPOTENCY_KEY)
        .map(|value| orders::validate_key(value.as_bytes()))
        .transpose()?;
    if let Some(key) = &key
        && let Some(existing) = orders::find_replay(state.store(), &budget, &order, key).await?
    {
        return Ok(created(existing, true));
    }
    let item = state.catalog.item(&budget, &order.sku).await?;
    state
        .prechecks
        .pass(&budget, &order.sku, order.quantity)
        .await?;
    let placed = orders::place_order(
        state.store(),
        &budget,
        &order,
        item.price_cents,
        key.as_deref(),
    )
    .await?;
    Ok(match placed {
        Placed::Created(order) => created(order, false),
        Placed::Replayed(order) => created(order, true),
    })
}

/// One order by id; 404 for an id that is unknown or not a number.
#[utoipa::path(
    get,
    path = "/api/orders/{id}",
    tag = "orders",
    summary = "Read an order",
    params(("id" = i64, Path, description = "The order's number")),
    responses(
        (status = 200, description = "The order", body = Order),
        (status = 404, description = "No such order (or an id that is not a number)", body = ProblemDetails),
        (status = 503, description = "The database is down or its pool is full", body = ProblemDetails),
    )
)]
pub(super) async fn get_order(
    State(state): State<AppState>,
    budget: Budget,
    Path(id): Path<String>,
) -> Result<Json<Order>, Problem> {
    let not_found = || Problem::not_found(format!("no order {id:?}"));
    let number: i64 = id.parse().map_err(|_| not_found())?;
    orders::find_order(state.store(), &budget, number)
        .await?
        .map(Json)
        .ok_or_else(not_found)
}

/// 201 with `Location`; a replay says so in `Idempotent-Replayed`.
fn created(order: Order, replayed: bool) -> Response {
    let location = format!("/api/orders/{}", order.id);
    let mut response = (StatusCode::CREATED, Json(order)).into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, location);
    }
    if replayed {
        headers.insert(
            HeaderName::from_static("idempotent-replayed"),
            HeaderValue::from_static("true"),
        );
    }
    response
}
