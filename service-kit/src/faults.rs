//! The fault injector: what the load experiment uses to make a downstream slow (the
//! catalog, and pricing behind it), and its admin routes, `GET|PUT|DELETE /admin/faults`.
//!
//! The delay is an ordinary `sleep` inside the handler. That is the point: the ingress
//! layer bounds the handler by the request's deadline, so a 1 s delay under a 300 ms
//! budget is cut at 300 ms with a 504, and when the caller disconnects hyper drops the
//! handler's future, which ends the sleep. A real slow dependency behaves the same way
//! when its I/O runs under the deadline.
//!
//! A straggler is a call slow by bad luck: a share of calls (`straggler_rate`) waits
//! `straggler_ms` more while the rest answer as usual, as a pause or a cold cache does
//! to a real service; the hedging experiments use it. `unavailable_rate` refuses that
//! share at once with 503 and `Retry-After`, before any work, as an overloaded service
//! sheds load: the `outage` experiment sets it to 1. `panic_rate` makes that share of
//! handlers panic, as a bug does: the answer is 500 `urn:problem:internal` all the same
//! (service_kit::layers::catch_panics), not a dropped connection.
//!
//! The busy fault is the opposite on purpose: `busy_ms` of spinning on the worker
//! thread, which never yields, as a CPU-bound handler or a blocking call does. Nothing
//! can cut it, not the deadline and not a caller that hangs up, and while it runs the
//! worker serves nothing else: the runtime's busy time rises (`tokio_*`, docs/design.md
//! §7), which is what the `saturation` experiment shows.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use deadline_propagation::{Problem, Stage};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::answers::Answers as _;
use crate::json::JsonBody;

/// The largest delay or jitter the admin API accepts, in milliseconds.
pub const MAX_DELAY_MS: u64 = 60_000;
/// The longest a request may spin on its worker thread, in milliseconds. The admin API
/// runs on the same workers, so a fault it cannot outlast would make it unreachable.
pub const MAX_BUSY_MS: u64 = 1_000;

/// What to inject into each answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// Fixed delay before answering.
    #[serde(default)]
    pub delay_ms: u64,
    /// Extra random delay, uniform in `0..=jitter_ms`.
    #[serde(default)]
    pub jitter_ms: u64,
    /// Share of answers that fail with 500, from 0.0 to 1.0.
    #[serde(default)]
    pub error_rate: f64,
    /// CPU spent spinning on the worker thread before the delay, never yielding.
    #[serde(default)]
    pub busy_ms: u64,
    /// Share of calls, from 0.0 to 1.0, that wait `straggler_ms` more.
    #[serde(default)]
    pub straggler_rate: f64,
    /// How much longer a straggler waits.
    #[serde(default)]
    pub straggler_ms: u64,
    /// Share of calls, from 0.0 to 1.0, refused at once with 503 (before any work).
    #[serde(default)]
    pub unavailable_rate: f64,
    /// Share of calls, from 0.0 to 1.0, whose handler panics after the delay.
    #[serde(default)]
    pub panic_rate: f64,
}

impl FaultConfig {
    /// Checks the ranges serde cannot express; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.delay_ms > MAX_DELAY_MS {
            return Err(format!("delay_ms must be at most {MAX_DELAY_MS}"));
        }
        if self.jitter_ms > MAX_DELAY_MS {
            return Err(format!("jitter_ms must be at most {MAX_DELAY_MS}"));
        }
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err("error_rate must be between 0.0 and 1.0".to_owned());
        }
        if self.busy_ms > MAX_BUSY_MS {
            return Err(format!("busy_ms must be at most {MAX_BUSY_MS}"));
        }
        if !(0.0..=1.0).contains(&self.straggler_rate) {
            return Err("straggler_rate must be between 0.0 and 1.0".to_owned());
        }
        if self.straggler_ms > MAX_DELAY_MS {
            return Err(format!("straggler_ms must be at most {MAX_DELAY_MS}"));
        }
        if !(0.0..=1.0).contains(&self.unavailable_rate) {
            return Err("unavailable_rate must be between 0.0 and 1.0".to_owned());
        }
        if !(0.0..=1.0).contains(&self.panic_rate) {
            return Err("panic_rate must be between 0.0 and 1.0".to_owned());
        }
        Ok(())
    }
}

/// The current faults, shared by the public handler and the admin API.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    current: Arc<RwLock<FaultConfig>>,
}

impl Faults {
    /// Faults that start as `initial`.
    pub fn new(initial: FaultConfig) -> Self {
        Self {
            current: Arc::new(RwLock::new(initial)),
        }
    }

    /// The faults in force.
    pub fn get(&self) -> FaultConfig {
        *self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the faults.
    pub fn set(&self, config: FaultConfig) {
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = config;
    }

    /// Applies the faults to one request: maybe refuses it, spins, sleeps (longer for a
    /// straggler), then maybe panics or fails.
    pub async fn inject(&self) -> Result<(), Problem> {
        let config = self.get();
        let chance = |rate: f64| rate > 0.0 && rand::rng().random_bool(rate);
        if chance(config.unavailable_rate) {
            return Err(Problem::overloaded(
                Stage::Ingress,
                Duration::from_secs(1),
                "the service is refusing calls (an injected fault); retry later",
            ));
        }
        if config.busy_ms > 0 {
            spin(Duration::from_millis(config.busy_ms));
        }
        let (delay, fail) = {
            let mut rng = rand::rng();
            let jitter = if config.jitter_ms > 0 {
                rng.random_range(0..=config.jitter_ms)
            } else {
                0
            };
            let straggles = config.straggler_rate > 0.0 && rng.random_bool(config.straggler_rate);
            let extra = if straggles { config.straggler_ms } else { 0 };
            (
                Duration::from_millis(config.delay_ms + jitter + extra),
                config.error_rate > 0.0 && rng.random_bool(config.error_rate),
            )
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if chance(config.panic_rate) {
            panic!("an injected panic (panic_rate)");
        }
        if fail {
            return Err(Problem::internal("injected fault"));
        }
        Ok(())
    }
}

/// Holds the calling thread for `length`, spinning: a blocking call on a worker thread,
/// as far as the runtime can tell.
fn spin(length: Duration) {
    let until = std::time::Instant::now() + length;
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// `GET|PUT|DELETE /admin/faults` on `faults`, for an admin router to guard: PUT
/// replaces the faults (missing fields are 0), DELETE resets them. Malformed JSON is
/// 400, unknown fields or out-of-range values are 422, each with a problem that names
/// the field.
pub fn routes(faults: Faults) -> Router {
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
