//! `/healthz` (the process is up) and `/readyz` (its dependencies answer).

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use deadline_propagation::{Deadline, Problem, Stage};
use serde::Serialize;
use service_kit::openapi::ProblemDetails;
use utoipa::ToSchema;

use crate::AppState;
use crate::budget::Budget;

/// A ready answer: each dependency that was asked, and how it answered.
#[derive(Serialize, ToSchema)]
pub(super) struct Ready {
    /// `ready`.
    #[schema(value_type = String, example = "ready")]
    status: &'static str,
    /// `ok`.
    #[schema(value_type = String, example = "ok")]
    database: &'static str,
    /// `ok`.
    #[schema(value_type = String, example = "ok")]
    catalog: &'static str,
}

/// Readiness is checked within this much, so a load balancer's probe never hangs.
const READY_BUDGET: Duration = Duration::from_millis(500);

/// 200 while the process runs.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "probes",
    responses((status = 200, description = "The process runs", body = String, content_type = "text/plain"))
)]
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// 200 when PostgreSQL and the catalog both answer within [`READY_BUDGET`], else 503.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "probes",
    responses(
        (status = 200, description = "PostgreSQL and the catalog answer within 500 ms", body = Ready),
        (status = 503, description = "One of them does not; `detail` says which", body = ProblemDetails),
    )
)]
pub(super) async fn readyz(
    State(state): State<AppState>,
    budget: Budget,
) -> Result<Json<Ready>, Problem> {
    // A probe is bounded in every mode, legacy too.
    let deadline = match budget {
        Budget::Deadline(deadline) => deadline.child(READY_BUDGET),
        Budget::Unbounded => Deadline::after(READY_BUDGET),
    };
    let database = async {
        state
            .db
            .read(&deadline, |conn| {
                Box::pin(async move { sqlx::query("SELECT 1").execute(conn).await.map(drop) })
            })
            .await
            .map_err(Problem::from)
    };
    let (database, catalog) = tokio::join!(database, state.catalog.ping(&deadline));
    let describe = |r: &Result<(), Problem>| match r {
        Ok(()) => "ok".to_owned(),
        Err(p) => p.detail().to_owned(),
    };
    if database.is_ok() && catalog.is_ok() {
        return Ok(Json(Ready {
            status: "ready",
            database: "ok",
            catalog: "ok",
        }));
    }
    let stage = if database.is_err() {
        Stage::DbPool
    } else {
        state.catalog.http().downstream().call()
    };
    Err(Problem::unavailable(
        stage,
        format!(
            "database: {}; catalog: {}",
            describe(&database),
            describe(&catalog)
        ),
    ))
}
