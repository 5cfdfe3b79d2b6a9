//! `/healthz` (the process is up), `/readyz` (it can serve: started, not draining) and
//! `/health/dependencies` (how PostgreSQL and the catalog answer, for people; see
//! [`crate::health`] for why readiness does not ask them).

use axum::Json;
use axum::extract::State;
use deadline_propagation::{Problem, Stage};
use serde::Serialize;
use service_kit::openapi::ProblemDetails;
use utoipa::ToSchema;

use crate::AppState;
use crate::health;

/// A ready answer.
#[derive(Serialize, ToSchema)]
pub(super) struct Ready {
    /// `ready`.
    #[schema(value_type = String, example = "ready")]
    status: &'static str,
}

/// How each dependency answered one check.
#[derive(Serialize, ToSchema)]
pub(super) struct DependencyReport {
    /// `ok` when both answered, else `degraded`.
    #[schema(value_type = String, example = "ok")]
    status: &'static str,
    /// `ok`, or why PostgreSQL did not answer `SELECT 1` within 500 ms.
    #[schema(example = "ok")]
    database: String,
    /// `ok`, or why the catalog's `/healthz` did not answer within 500 ms.
    #[schema(example = "ok")]
    catalog: String,
}

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

/// 200 while the service can serve: it has started (its migrations ran before it
/// listened) and is not shutting down. What its dependencies do does not change it.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "probes",
    responses(
        (status = 200, description = "Started and not draining, whatever PostgreSQL and the catalog do", body = Ready),
        (status = 503, description = "Shutting down", body = ProblemDetails),
    )
)]
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Ready>, Problem> {
    if state.health.is_draining() {
        return Err(Problem::unavailable(
            Stage::Ingress,
            "the service is shutting down",
        ));
    }
    Ok(Json(Ready { status: "ready" }))
}

/// Asks PostgreSQL and the catalog now, within 500 ms, and says how each answered:
/// always 200, for people and scripts (the `dependency_up` gauges say the same to
/// Prometheus, every `DEPENDENCY_CHECK_EVERY_MS`).
#[utoipa::path(
    get,
    path = "/health/dependencies",
    tag = "probes",
    responses((status = 200, description = "How each dependency answered", body = DependencyReport))
)]
pub(super) async fn dependencies(State(state): State<AppState>) -> Json<DependencyReport> {
    let checked = health::check(&state.checked()).await;
    let describe = |answer: &Result<(), Problem>| match answer {
        Ok(()) => "ok".to_owned(),
        Err(problem) => problem.detail().to_owned(),
    };
    let ok = checked.database.is_ok() && checked.catalog.is_ok();
    Json(DependencyReport {
        status: if ok { "ok" } else { "degraded" },
        database: describe(&checked.database),
        catalog: describe(&checked.catalog),
    })
}
