//! End-to-end deadline propagation for axum services.
//!
//! A client sends its time budget in `X-Request-Timeout-Ms`. The ingress accepts it up
//! to a maximum and turns it into a [`Deadline`], an absolute instant. Every step after
//! that (a pooled HTTP call, a database statement, an AI tool call) gets only what is
//! left, and a step that would start with nothing left is answered with 504 at once,
//! without doing any I/O. This crate is the part every service shares; copy it into your
//! own workspace.
//!
//! # Module map
//!
//! The core is always built (it compiles with `--no-default-features`); the rest comes
//! with a Cargo feature, all of them on by default (see the README, "Use it in your
//! service", for what each pulls in).
//!
//! - [`deadline`]: [`Deadline`], [`DeadlinePolicy`] (clamping) and [`Deadline::run`], the
//!   one function that runs an I/O step under the remaining time.
//! - [`header`]: parsing the budget headers (`X-Request-Timeout-Ms`, `grpc-timeout`,
//!   `x-envoy-expected-rq-timeout-ms`): absent, valid or invalid, never a panic.
//! - [`stage`]: the named [`Stage`]s a budget is spent on (`ingress`, `catalog_pool`, ...),
//!   and [`Downstream`](stage::Downstream), the two stages of a client named by configuration.
//! - [`problem`]: [`Problem`], the RFC 9457 error answer of both services (with `axum`,
//!   also an `IntoResponse`).
//! - [`timing`]: the per-request [`StageLog`](timing::StageLog) behind `Server-Timing`.
//! - [`ingress`]: [`DeadlineMode`] and its run-time switch; with `axum`, the tower layer
//!   that builds the deadline, bounds the handler, answers 400/504 and writes
//!   `Server-Timing`.
//! - [`tools`]: [`ToolBudget`](tools::ToolBudget), quotas for the tool calls of an AI assistant turn.
//! - [`telemetry`]: `traceparent` propagation (a no-op without `otel`); with `otel`, the
//!   log and trace setup of a binary.
//! - `json` (feature `axum`): `JsonBody`, a JSON extractor whose rejections are problems.
//! - `server` (feature `axum`): serving a router with a header read timeout and graceful
//!   shutdown.
//! - `admin` (feature `axum`): the loopback-only guard of an admin API.
//! - `client` (feature `http-client`): `BudgetedClient`, the bulkhead-guarded reqwest
//!   client that spends only the remaining budget on pool wait + request + body, for
//!   any request (`CallRequest`) to a downstream named by configuration.
//! - `db` (feature `sqlx`): PostgreSQL helpers: pool acquire bounded by the budget,
//!   transactions whose `statement_timeout` comes from the remaining time, and a COMMIT
//!   whose answer is always true about the table.
//! - `metrics` (feature `metrics`): the Prometheus families of the contract; with `axum`,
//!   the HTTP middleware and `GET /metrics`.
//! - `clap` (feature): `clap::ValueEnum` for the enums that are settings.
//!
//! A whole service in one file: `shared/examples/minimal.rs`.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use shared::{Deadline, DeadlineLayer, DeadlinePolicy, Problem, Stage};
//!
//! async fn handler(deadline: Deadline) -> Result<&'static str, Problem> {
//!     // Any I/O goes through `run`: it never starts once the budget is gone.
//!     deadline.run(Stage::Catalog, async { "catalog answer" }).await?;
//!     Ok("done")
//! }
//!
//! let policy = DeadlinePolicy::new(Duration::from_millis(2000), Duration::from_millis(1000));
//! let app: Router = Router::new()
//!     .route("/", get(handler))
//!     .route_layer(DeadlineLayer::new(policy));
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

// The core: always built (`--no-default-features` too).
pub mod deadline;
pub mod header;
pub mod ingress;
pub mod problem;
pub mod stage;
pub mod telemetry;
pub mod timing;
pub mod tools;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod admin;
#[cfg(feature = "http-client")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-client")))]
pub mod client;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod db;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod json;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod server;

#[cfg(feature = "axum")]
mod extract;

pub use deadline::{Deadline, DeadlineExceeded, DeadlinePolicy};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use ingress::DeadlineLayer;
pub use ingress::DeadlineMode;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use json::JsonBody;
pub use problem::Problem;
pub use stage::Stage;
