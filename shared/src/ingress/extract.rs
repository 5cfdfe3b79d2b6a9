//! `Deadline` as an axum extractor, so handlers simply take a `Deadline` argument.

use axum::extract::FromRequestParts;
use http::request::Parts;

use crate::deadline::Deadline;
use crate::problem::Problem;

impl<S: Send + Sync> FromRequestParts<S> for Deadline {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // Only a route without the layer gets here: a wiring bug, not the client's.
        parts
            .extensions
            .get::<Deadline>()
            .cloned()
            .ok_or_else(|| Problem::internal("route is missing the DeadlineLayer"))
    }
}
