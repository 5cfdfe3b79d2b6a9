//! End-to-end deadline propagation for axum services.
//!
//! A client sends its time budget in `X-Request-Timeout-Ms`. The ingress accepts it up
//! to a maximum and turns it into a [`Deadline`], an absolute instant. Every step after
//! that (a pooled HTTP call, a SQL statement, a tool call) gets only what is left; a
//! step that would start with nothing left is answered 504 at once, without any I/O.
//! Copy this crate (the folder `shared/`) into your workspace: it names its own
//! dependencies and builds alone.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Problem, Stage};
//!
//! async fn handler(deadline: Deadline) -> Result<&'static str, Problem> {
//!     // Any I/O goes through `run`: it never starts once the budget is gone.
//!     const WORK: Stage = Stage::named("work");
//!     deadline.run(WORK, tokio::time::sleep(Duration::from_millis(5))).await?;
//!     Ok("done")
//! }
//!
//! let policy = DeadlinePolicy::from_millis(2000, 1000); // at most 2 s; 1 s without a header
//! let app: Router = Router::new().route("/", get(handler)).route_layer(DeadlineLayer::new(policy));
//! ```
//!
//! # Reading order
//!
//! The core, always built, in the order a request meets it:
//!
//! 1. [`read_budget`] (`header/`): the budget headers, absent, valid or invalid.
//! 2. [`DeadlinePolicy`] and [`Deadline`] (`deadline/`): the clamp, the instant, and
//!    [`Deadline::run`], the one function that runs an I/O step under what is left.
//! 3. [`DeadlineLayer`] (`ingress/`): the tower layer that makes the deadline, races the
//!    handler against it and writes `Server-Timing` (`timing.rs`).
//! 4. [`Problem`] (`problem/`): the answers, 504 naming its [`Stage`] (`stage.rs`).
//! 5. [`DeadlineMode`] (`mode.rs`): propagate, or observe (count, refuse nothing).
//!
//! The chain beside it, each on the core alone: `client` (feature `http-client`), one
//! timeout over pool wait, request and body, the budget sent on; then `db` (feature
//! `sqlx`), `statement_timeout` from what is left, a cancel at the deadline, COMMIT as a
//! point of no return. Beside them, `grpc` (feature `grpc`): the same budget across a
//! tonic hop, `grpc-timeout` out with nothing at the call site, `DEADLINE_EXCEEDED` back.
//!
//! The extras, each opt-in on what it extends: `admission` (refuse calls predicted
//! late), `hedging` (a backup for a slow call), `retry-budget` (bound extra attempts),
//! `tools` (an AI assistant's tool budgets), `metrics` (the Prometheus families of the
//! contract), `otel` (W3C trace context across each hop), `tls` (HTTPS for the client).

#![cfg_attr(docsrs, feature(doc_cfg))]

// The core, always built, bottom first: each module imports only the ones above it
// (tests/layers.rs checks it).
mod deadline;
mod header;
mod ingress;
mod mode;
mod problem;
mod stage;
mod timing;
mod trace;

// The chain: each imports only the core.
#[cfg(feature = "http-client")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-client")))]
pub mod client;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod db;
#[cfg(any(feature = "http-client", feature = "grpc"))]
mod downstream;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;

// The extras: each imports only what it extends.
#[cfg(feature = "admission")]
#[cfg_attr(docsrs, doc(cfg(feature = "admission")))]
pub mod admission;
#[cfg(feature = "hedging")]
#[cfg_attr(docsrs, doc(cfg(feature = "hedging")))]
pub mod hedging;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "queue")]
#[cfg_attr(docsrs, doc(cfg(feature = "queue")))]
pub mod queue;
#[cfg(feature = "retry-budget")]
#[cfg_attr(docsrs, doc(cfg(feature = "retry-budget")))]
pub mod retry_budget;
#[cfg(feature = "tools")]
#[cfg_attr(docsrs, doc(cfg(feature = "tools")))]
pub mod tools;

#[cfg(feature = "test-util")]
#[doc(hidden)]
pub mod testing;

pub use deadline::{Deadline, DeadlineExceeded, DeadlinePolicy, NO_RETURN_GRACE};
#[cfg(any(feature = "http-client", feature = "grpc"))]
pub use downstream::{Downstream, InvalidName};
#[doc(hidden)]
pub use header::InvalidValue;
pub use header::{InvalidBudget, PREVIOUS_ATTEMPTS_HEADER, REQUEST_TIMEOUT_HEADER, read_budget};
pub use ingress::{DeadlineLayer, DeadlineService, ResponseFuture};
#[cfg(feature = "metrics")]
pub use metrics::{instrument, measure};
pub use mode::{DEADLINE_MODE_HEADER, DeadlineMode, LiveMode};
pub use problem::Problem;
pub use stage::Stage;
