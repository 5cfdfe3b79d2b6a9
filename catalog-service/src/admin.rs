//! The admin API: `GET|PUT|DELETE /admin/faults`, on the admin address only.
//!
//! PUT replaces the faults (missing fields are 0), DELETE resets them. Malformed JSON is
//! 400, unknown fields or out-of-range values are 422, each with a problem that names
//! the field.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use shared::{JsonBody, Problem};

use crate::faults::{FaultConfig, Faults};

/// The admin router.
pub fn router(faults: Faults) -> Router {
    Router::new()
        .route(
            "/admin/faults",
            get(get_faults).put(put_faults).delete(delete_faults),
        )
        .with_state(faults)
}

async fn get_faults(State(faults): State<Faults>) -> Json<FaultConfig> {
    Json(faults.get())
}

async fn put_faults(
    State(faults): State<Faults>,
    JsonBody(config): JsonBody<FaultConfig>,
) -> Result<Json<FaultConfig>, Problem> {
    config.validate().map_err(Problem::unprocessable)?;
    faults.set(config);
    tracing::info!(?config, "faults set");
    Ok(Json(config))
}

async fn delete_faults(State(faults): State<Faults>) -> StatusCode {
    faults.set(FaultConfig::default());
    tracing::info!("faults reset");
    StatusCode::NO_CONTENT
}
