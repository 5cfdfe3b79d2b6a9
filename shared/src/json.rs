//! [`JsonBody`]: axum's `Json` extractor with its rejections turned into [`Problem`]s.
//!
//! axum already tells the cases apart; this only gives them the status codes the
//! contract promises (400 malformed, 415 wrong media type, 413 too large, 422 a value
//! that does not fit the schema) and a problem body instead of plain text.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use http::StatusCode;
use serde::de::DeserializeOwned;

use crate::problem::Problem;

/// A JSON request body of type `T`, or a 4xx problem that says what was wrong.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(problem_for(rejection)),
        }
    }
}

fn problem_for(rejection: JsonRejection) -> Problem {
    match rejection {
        JsonRejection::JsonDataError(err) => Problem::unprocessable(err.body_text()),
        JsonRejection::JsonSyntaxError(err) => Problem::bad_request(err.body_text()),
        JsonRejection::MissingJsonContentType(_) => {
            Problem::unsupported_media_type("expected a body with Content-Type: application/json")
        }
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Problem::payload_too_large("the request body is over the size limit")
        }
        other => Problem::bad_request(other.body_text()),
    }
}
