//! The ingress layer: where a client's budget becomes a [`Deadline`](crate::Deadline).
//!
//! For every request it reads the budget headers (the smallest wins; a malformed one is
//! a 400 naming it), clamps the budget to the service's maximum, puts the `Deadline` in
//! the request's extensions (handlers take it as an argument), races the handler
//! against it (504 `ingress` when it loses), and adds `Server-Timing`. Like
//! tower-http's middleware it *answers* instead of returning an error, which would make
//! hyper drop the connection. Laid out like tower's `timeout`: `layer` holds the
//! configuration, `service` does the per-request work, `future` races the handler.

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::DeadlineLayer;
pub use service::DeadlineService;
#[cfg(feature = "metrics")]
pub(crate) use service::record_on_current_span;
