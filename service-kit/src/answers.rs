//! [`Answers`]: the demo's own problem answers, beside the crate's (504, 503, 502, the
//! invalid budget header): malformed or oversized bodies, a forbidden admin call, a
//! conflict, a value out of range. Each is a [`Problem`] of the contract (docs/design.md
//! §3.6); bring the trait into scope and call them as `Problem::conflict(..)`.

use deadline_propagation::Problem;
use http::StatusCode;

/// The demo's answers as constructors of [`Problem`].
pub trait Answers {
    /// 400: the request cannot be understood (malformed JSON).
    fn bad_request(detail: impl Into<String>) -> Problem;
    /// 403: the client may not use this endpoint.
    fn forbidden(detail: impl Into<String>) -> Problem;
    /// 409: the request conflicts with the current state (not enough stock).
    fn conflict(detail: impl Into<String>) -> Problem;
    /// 413: the body is over the limit.
    fn payload_too_large(detail: impl Into<String>) -> Problem;
    /// 415: the body is not JSON.
    fn unsupported_media_type(detail: impl Into<String>) -> Problem;
    /// 422: well-formed, but a value is missing or out of range.
    fn unprocessable(detail: impl Into<String>) -> Problem;
}

impl Answers for Problem {
    fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "urn:problem:bad-request", detail)
    }

    fn forbidden(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::FORBIDDEN, "urn:problem:forbidden", detail)
    }

    fn conflict(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::CONFLICT, "urn:problem:conflict", detail)
    }

    fn payload_too_large(detail: impl Into<String>) -> Problem {
        let status = StatusCode::PAYLOAD_TOO_LARGE;
        Problem::new(status, "urn:problem:payload-too-large", detail)
    }

    fn unsupported_media_type(detail: impl Into<String>) -> Problem {
        let status = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        Problem::new(status, "urn:problem:unsupported-media-type", detail)
    }

    fn unprocessable(detail: impl Into<String>) -> Problem {
        let status = StatusCode::UNPROCESSABLE_ENTITY;
        Problem::new(status, "urn:problem:validation", detail)
    }
}
