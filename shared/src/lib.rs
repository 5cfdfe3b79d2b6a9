//! End-to-end deadline propagation for axum services.
//!
//! A client sends its time budget in `X-Request-Timeout-Ms`. The ingress accepts it up
//! to a maximum and turns it into a [`Deadline`], an absolute instant. Every step after
//! that (a pooled HTTP call, a database statement, an AI tool call) gets only what is
//! left, and a step that would start with nothing left is answered with 504 at once,
//! without doing any I/O. Copy this crate (the folder `shared/`) into your workspace: it
//! names its own dependencies and builds alone.
//!
//! # Module map
//!
//! The core is always built; the rest comes with a Cargo feature, all of them on by
//! default but `tls`. The modules are in layers and import downward only (the order of
//! the `mod` lines below; `tests/layers.rs` checks it): the core, bottom first the
//! budget headers, the modes, the trace context and the stage names, then the stage
//! log, the deadline and the answers; the metrics on the core, with a stand-in that
//! keeps nothing where the feature is off; and the parts that spend a budget (the
//! ingress, the client, the database, tool budgets) on both.
//!
//! - [`Deadline`] and [`DeadlinePolicy`]: the budget as an absolute instant, clamped at
//!   the ingress; [`Deadline::run`] is the one function that runs an I/O step under the
//!   remaining time, and [`Deadline::point_of_no_return`] marks a step (a COMMIT) whose
//!   outcome must be awaited rather than abandoned.
//! - [`read_budget`]: the budget headers (`X-Request-Timeout-Ms`, `grpc-timeout`,
//!   `x-envoy-expected-rq-timeout-ms`), absent, valid or [`InvalidBudget`], never a panic.
//! - [`Stage`] and [`Downstream`]: the named steps a budget is spent on; the stages of a
//!   downstream are named by your configuration (`Downstream::new("inventory")`).
//! - [`Problem`]: the RFC 9457 answer (504 with its stage, 503 with `Retry-After`, 400
//!   naming a header).
//! - [`DeadlineMode`] and [`LiveMode`]: propagate, observe (count, refuse nothing) or
//!   the off switch, changeable at run time.
//! - [`ToolBudget`]: the budget of an AI assistant's turn shared by its tool calls.
//! - [`DeadlineLayer`] (feature `axum`): the tower layer that builds the deadline,
//!   bounds the handler, answers 400 and 504 and writes `Server-Timing`; [`Deadline`] is
//!   an extractor.
//! - [`client`] (feature `http-client`): [`BudgetedClient`](client::BudgetedClient),
//!   which spends only the remaining budget on pool wait + request + body, admits only
//!   the calls that can finish, and sends the rest of the budget on.
//! - [`db`] (feature `sqlx`): PostgreSQL under the budget: pool wait, `statement_timeout`
//!   from the remaining time, a cancel at the deadline, COMMIT as a point of no return.
//! - [`metrics`] (feature `metrics`): the Prometheus families ([`metrics::names`] lists
//!   them), and [`instrument`] to wire them with the layer.
//!
//! `otel` carries W3C `traceparent` across each hop (a no-op without it), `tls` gives
//! the client HTTPS.
//!
//! The examples, a ladder: `ingress` (the layer alone), `client` (a budgeted call), and
//! `database` (a whole service), under `shared/examples/`.
//!
//! # Example
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
//! let policy = DeadlinePolicy::from_millis(2000, 1000);
//! let app: Router = Router::new()
//!     .route("/", get(handler))
//!     .route_layer(DeadlineLayer::new(policy));
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

// The core, always built, bottom first: each module imports only the ones above it
// (tests/layers.rs checks it). The stage names, the budget headers and the modes are
// leaves; the trace context is carried only with `otel` (a no-op without it).
mod header;
mod mode;
mod stage;
mod trace;
// Where a budget went, the deadline, the answers, and the ingress that makes them.
mod deadline;
mod ingress;
mod problem;
mod timing;

// The chain beside the core: each imports only the core.
#[cfg(feature = "http-client")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-client")))]
pub mod client;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod db;

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
#[cfg(feature = "retry-budget")]
#[cfg_attr(docsrs, doc(cfg(feature = "retry-budget")))]
pub mod retry_budget;
#[cfg(feature = "tools")]
#[cfg_attr(docsrs, doc(cfg(feature = "tools")))]
pub mod tools;

#[doc(hidden)]
pub mod testing;

pub use deadline::{Deadline, DeadlineExceeded, DeadlinePolicy, LiveMode};
pub use header::{DEADLINE_MODE_HEADER, InvalidBudget, REQUEST_TIMEOUT_HEADER, read_budget};
pub use ingress::{DeadlineLayer, DeadlineService, ResponseFuture};
#[cfg(feature = "metrics")]
pub use metrics::{instrument, measure};
pub use mode::DeadlineMode;
pub use problem::Problem;
pub use stage::{Downstream, InvalidName, Stage};
