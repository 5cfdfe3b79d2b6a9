//! `POST /api/orders/{id}/shipments` and `GET /api/shipments/{job}`: the queue hop
//! (`crate::shipments`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use deadline_propagation::Problem;
use service_kit::openapi::ProblemDetails;

use crate::AppState;
use crate::budget::Budget;
use crate::shipments::{self, ShipmentJob};

/// Books a pickup for an order through the queue.
#[utoipa::path(
    post,
    path = "/api/orders/{id}/shipments",
    tag = "shipments",
    summary = "Book a shipment for an order",
    description = "Enqueues a shipment job carrying what is left of the request's budget (less \
                   `SHIPMENTS_RESERVE_MS` when the caller waits); shipping-worker books it only \
                   while that deadline is ahead, and commits the shipment with the job's `done`.",
    params(
        ("id" = i64, Path, description = "The order's number"),
        ("Prefer" = Option<String>, Header, description = "`respond-async`: answer 202 at once \
          with the job's `Location` instead of waiting"),
    ),
    responses(
        (status = 201, description = "The shipment is booked and committed", body = ShipmentJob,
         headers(("Location" = String, description = "The job's URL, `/api/shipments/{job}`"))),
        (status = 202, description = "`Prefer: respond-async`: the job is queued; its state is at `Location`. An expired job never starts", body = ShipmentJob,
         headers(("Location" = String, description = "The job's URL, `/api/shipments/{job}`"))),
        (status = 404, description = "No such order (or an id that is not a number). Nothing was queued", body = ProblemDetails),
        (status = 500, description = "`urn:problem:outcome-unknown`: the job could not be expired in time, so it may still take effect; its state is at `Location`", body = ProblemDetails),
        (status = 502, description = "The job's work failed on every attempt. No shipment", body = ProblemDetails),
        (status = 503, description = "The database is down or its pool is full. Nothing was queued", body = ProblemDetails),
        (status = 504, description = "The budget ran out: the job was expired (stage `queue`) or never queued, and it never takes effect", body = ProblemDetails),
    )
)]
pub(super) async fn create_shipment(
    State(state): State<AppState>,
    budget: Budget,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    shipments::create(&state.shipments, state.store(), budget, &id, &headers).await
}

/// A shipment job's state, as its table says.
#[utoipa::path(
    get,
    path = "/api/shipments/{job}",
    tag = "shipments",
    summary = "Read a shipment job",
    params(("job" = i64, Path, description = "The job's number")),
    responses(
        (status = 200, description = "The job: `queued`, `running`, `done` (with the shipment), \
          `expired` (it never takes effect) or `failed`", body = ShipmentJob),
        (status = 404, description = "No such job (or an id that is not a number)", body = ProblemDetails),
        (status = 503, description = "The database is down or its pool is full", body = ProblemDetails),
    )
)]
pub(super) async fn get_shipment(
    State(state): State<AppState>,
    budget: Budget,
    Path(job): Path<String>,
) -> Result<Json<ShipmentJob>, Problem> {
    shipments::read(&state.shipments, budget, &job).await
}
