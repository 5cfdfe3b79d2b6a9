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
//! - [`deadline`]: [`Deadline`], [`DeadlinePolicy`] (clamping) and [`Deadline::run`], the
//!   one function that runs an I/O step under the remaining time.
//! - [`header`]: parsing the budget headers (`X-Request-Timeout-Ms`, `grpc-timeout`,
//!   `x-envoy-expected-rq-timeout-ms`): absent, valid or invalid, never a panic.
//! - [`stage`]: the named [`Stage`]s a budget is spent on (`ingress`, `catalog_pool`, ...),
//!   and [`Downstream`](stage::Downstream), the two stages of a client named by configuration.
//! - [`ingress`]: the tower layer that builds the deadline, bounds the handler, answers
//!   400/504 and writes `Server-Timing`.
//! - [`timing`]: the per-request [`StageLog`](timing::StageLog) behind `Server-Timing`.
//! - [`problem`]: [`Problem`], the RFC 9457 error answer of both services.
//! - [`json`]: [`JsonBody`], a JSON extractor whose rejections are problems.
//! - [`client`]: [`BudgetedClient`](client::BudgetedClient), the bulkhead-guarded reqwest client
//!   that spends only the remaining budget on pool wait + request + body, for any
//!   request ([`CallRequest`](client::CallRequest)).
//! - [`db`]: PostgreSQL helpers: pool acquire bounded by the budget, transactions whose
//!   `statement_timeout` and `lock_timeout` come from the remaining time.
//! - [`tools`]: [`ToolBudget`](tools::ToolBudget), quotas for the tool calls of an AI assistant turn.
//! - [`metrics`]: the Prometheus families of the contract and the HTTP middleware.
//! - [`server`]: serving a router with a header read timeout and graceful shutdown.
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

pub mod admin;
pub mod client;
pub mod db;
pub mod deadline;
pub mod header;
pub mod ingress;
pub mod json;
pub mod metrics;
pub mod problem;
pub mod server;
pub mod stage;
pub mod telemetry;
pub mod timing;
pub mod tools;

mod extract;

pub use deadline::{Deadline, DeadlineExceeded, DeadlinePolicy};
pub use ingress::{DeadlineLayer, DeadlineMode};
pub use json::JsonBody;
pub use problem::Problem;
pub use stage::Stage;
