//! `POST /api/orders` and `GET /api/orders/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use deadline_propagation::{Deadline, Problem};
use service_kit::json::JsonBody;

use crate::AppState;
use crate::orders::{self, NewOrderRequest, Order, Placed};

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Validates, answers a replay from the table, prices the order through the catalog,
/// asks the configured prechecks, and places it: each step under what is left of the
/// request's budget.
pub(super) async fn create_order(
    State(state): State<AppState>,
    deadline: Deadline,
    headers: HeaderMap,
    JsonBody(request): JsonBody<NewOrderRequest>,
) -> Result<Response, Problem> {
    let order = request.validate()?;
    let key = headers
        .get(IDEMPOTENCY_KEY)
        .map(|value| orders::validate_key(value.as_bytes()))
        .transpose()?;
    if let Some(key) = &key
        && let Some(existing) = orders::find_replay(&state.db, &deadline, &order, key).await?
    {
        return Ok(created(existing, true));
    }
    let item = state.catalog.item(&deadline, &order.sku).await?;
    state.prechecks.pass(&deadline, &order).await?;
    let placed = orders::place_order(
        &state.db,
        &deadline,
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
pub(super) async fn get_order(
    State(state): State<AppState>,
    deadline: Deadline,
    Path(id): Path<String>,
) -> Result<Json<Order>, Problem> {
    let not_found = || Problem::not_found(format!("no order {id:?}"));
    let number: i64 = id.parse().map_err(|_| not_found())?;
    orders::find_order(&state.db, &deadline, number)
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
