#![doc = include_str!("../README.md")]
//!
//! # Reading order
//!
//! Where a learner starts, in the order a request meets the code:
//!
//! 1. [`Deadline`] and [`DeadlinePolicy`] (`deadline/`): the clamp, the absolute
//!    instant, and [`Deadline::run`], the one function that runs an I/O step under what
//!    is left; [`Stage`] (`stage.rs`) names the step.
//! 2. [`DeadlineLayer`] (`ingress/`): the tower layer that makes the deadline from the
//!    request, races the handler against it and writes `Server-Timing` (`timing.rs`).
//! 3. A budgeted step: `client` (feature `http-client`), one timeout over the wait for a
//!    pooled slot, the request and its body, the budget sent on; then `db` (feature
//!    `sqlx`), `statement_timeout` from what is left, a cancel at the deadline, COMMIT
//!    as a point of no return; beside them `grpc` (feature `grpc`), the same budget
//!    across a tonic hop.
//! 4. [`Problem`] (`problem/`): the answers, a 504 naming its stage; [`DeadlineMode`]
//!    (`mode.rs`): propagate, or observe (count, refuse nothing).
//! 5. The extras, each opt-in on what it extends: `admission` (refuse calls predicted
//!    late), `hedging` (a backup for a slow call), `retry_budget` (bound extra
//!    attempts), `tools` (an AI assistant's tool budgets), `metrics` (the Prometheus
//!    families), `otel` (W3C trace context across each hop), `tls` (HTTPS).
//! 6. Last, the hardened parsers: [`read_budget`] (`header/`), the budget headers
//!    (absent, valid, or refused with a reason) as untrusted input: bounded, and never
//!    a panic, whatever a client or a downstream sends.

#![cfg_attr(docsrs, feature(doc_cfg))]

// The core, always built, in rustfmt's alphabetical order. Its layers, bottom first:
// stage, header, mode, trace, timing, deadline, problem, ingress; each module imports
// only the ones below it (tests/layers.rs checks it).
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
