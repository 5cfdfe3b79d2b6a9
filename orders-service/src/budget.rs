//! [`Budget`]: what a request may spend, as handlers take it.
//!
//! In `observe` and `propagate` the deadline layer gives every request a [`Deadline`]
//! and each step spends only what is left of it. In `legacy` the request goes round the
//! layer ([`crate::mode`]) and each step takes the path a service without the technique
//! has: no budget, fixed timeouts (`legacy.rs`).

use axum::extract::FromRequestParts;
use deadline_propagation::{Deadline, Problem};
use http::request::Parts;

/// What one request may spend.
#[derive(Clone, Debug)]
pub enum Budget {
    /// What is left of this deadline (propagate, observe).
    Deadline(Deadline),
    /// No budget at all (legacy): every step is bounded by its own fixed timeout only.
    Unbounded,
}

impl<S: Send + Sync> FromRequestParts<S> for Budget {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        if let Some(deadline) = parts.extensions.get::<Deadline>() {
            return Ok(Budget::Deadline(deadline.clone()));
        }
        // Only the legacy router puts this here; a route with neither is a wiring bug.
        parts
            .extensions
            .get::<Budget>()
            .cloned()
            .ok_or_else(|| Problem::internal("route is missing the DeadlineLayer"))
    }
}
