//! The budget across a gRPC hop, for tonic: a client layer and a server layer, on the
//! core alone.
//!
//! tonic sends `grpc-timeout` only when each call site sets it on each request, and its
//! server answers `CANCELLED` when that timeout fires, so the caller cannot tell a spent
//! budget from a hang-up. These layers close both gaps:
//!
//! - [`GrpcClientLayer`] (around a `tonic::transport::Channel`) reads the request's
//!   [`Deadline`] (from the request's extensions, else
//!   [`Deadline::current`], which the ingress sets around
//!   every handler), sends what is left less a reserve as `grpc-timeout`, never starts
//!   a call on a spent budget, and retries an `UNAVAILABLE` once only when no caller
//!   above owns retries (`x-previous-attempts`).
//! - [`GrpcServerLayer`] (on `tonic::transport::Server`) makes the deadline from the
//!   budget headers (`grpc-timeout` among them) clamped by the policy, sets it as the
//!   handler's current deadline, and answers `DEADLINE_EXCEEDED` at the deadline,
//!   dropping the handler's work there.
//!
//! [`problem`] turns a failed call's `Status` into the answer of the contract: a 504
//! naming the downstream for `DEADLINE_EXCEEDED`, a 503 for `UNAVAILABLE`.
//!
//! Unary calls only: the client buffers the request body so that a retry can send it
//! again, and the server bounds the response head, which for a unary call comes after
//! the handler's work.

mod client;
mod server;

pub use client::{GrpcClient, GrpcClientLayer};
pub use server::{GrpcServer, GrpcServerLayer};

use std::time::Duration;

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::downstream::Downstream;
use crate::problem::Problem;

/// The answer for a call to `downstream` that failed with `status`.
pub fn problem(status: &tonic::Status, downstream: Downstream, deadline: &Deadline) -> Problem {
    let stage = downstream.call();
    match status.code() {
        tonic::Code::DeadlineExceeded => Problem::deadline(DeadlineExceeded {
            stage,
            budget: deadline.budget(),
            elapsed: deadline.elapsed(),
        }),
        tonic::Code::Unavailable | tonic::Code::ResourceExhausted => {
            Problem::unavailable(stage, status.message())
        }
        _ => Problem::bad_gateway(stage, format!("{:?}: {}", status.code(), status.message())),
    }
}

/// A `grpc-timeout` value in whole milliseconds (8 digits at most, as the spec allows).
fn grpc_timeout(ms: u64) -> http::HeaderValue {
    let value = match ms {
        ..=99_999_999 => format!("{ms}m"),
        _ => format!("{}S", Duration::from_millis(ms).as_secs().min(99_999_999)),
    };
    http::HeaderValue::try_from(value).expect("digits and a unit are a valid header value")
}
