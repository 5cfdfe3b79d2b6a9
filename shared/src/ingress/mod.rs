//! The ingress layer: where a client's budget becomes a [`Deadline`](crate::Deadline).
//!
//! For every request it
//! 1. reads the budget headers (`X-Request-Timeout-Ms`, `grpc-timeout`,
//!    `x-envoy-expected-rq-timeout-ms`; the smallest wins) and answers a 400 problem
//!    naming the header that is malformed,
//! 2. clamps the budget to the service's maximum and counts the clamp,
//! 3. puts the `Deadline` into the request extensions (handlers take it as an argument),
//! 4. races the handler against the deadline and answers 504 `ingress` when it loses,
//! 5. adds `Server-Timing` with the stages the request went through.
//!
//! Like tower-http's middleware it *answers* (400, 504) instead of returning an error,
//! which would make hyper drop the connection, and it keeps the inner error type.
//!
//! Laid out like tower's `timeout`: `layer` holds the configuration, `service` does
//! the per-request work, `future` races the handler against the deadline; `extract`
//! hands the deadline to handlers, and `metrics` (feature `metrics`) measures every
//! request and serves `GET /metrics`.

mod current_span;
mod extract;
mod future;
mod layer;
mod service;

#[cfg(feature = "metrics")]
pub(crate) use current_span::record as record_on_current_span;
pub use future::ResponseFuture;
pub use layer::DeadlineLayer;
pub use service::DeadlineService;
