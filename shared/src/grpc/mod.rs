//! The budget across a gRPC hop, for tonic: a client layer and a server layer, on the
//! core alone. Both work on any channel and any method, streams included.
//!
//! tonic sends `grpc-timeout` only when each call site sets it on each request, and its
//! server answers `CANCELLED` when that timeout fires, so the caller cannot tell a spent
//! budget from a hang-up. These layers close both gaps:
//!
//! - [`GrpcClientLayer`] (around a `tonic::transport::Channel`) reads the request's
//!   [`Deadline`] (from the request's extensions, else
//!   [`Deadline::current`], which the ingress sets around
//!   every handler), sends what is left less a reserve as `grpc-timeout` (or the
//!   caller's own per-call timeout, when that is shorter), never starts a call on a
//!   spent budget, bounds the wait for the channel's capacity, the answer and a server
//!   stream's messages by it, and retries only what cannot have done anything, when
//!   no caller above owns retries (`x-previous-attempts`).
//! - [`GrpcServerLayer`] (on `tonic::transport::Server`) makes the deadline from the
//!   budget headers (`grpc-timeout` among them) clamped by the policy, sets it as the
//!   handler's current deadline, and answers `DEADLINE_EXCEEDED` at the deadline,
//!   dropping the handler's work there (or `UNKNOWN`, for a handler past its point of
//!   no return that the grace did not see finish).
//!
//! Streams pass through unbuffered: a request stream goes out as the caller writes it,
//! a response stream's messages reach the caller as they come, and a stream still
//! running at the deadline ends there with `DEADLINE_EXCEEDED` in its trailers. So a
//! stream is never retried; a unary request is kept (up to a size) for a retry.
//!
//! [`problem`] turns a failed call's `Status` into the answer of the contract: a 504
//! naming the downstream for `DEADLINE_EXCEEDED`, a 503 for `UNAVAILABLE`, a 500
//! `outcome-unknown` for `UNKNOWN`, a 502 for the rest.

mod body;
mod client;
mod server;

pub use client::{GrpcClient, GrpcClientLayer};
pub use server::{GrpcServer, GrpcServerLayer};

use std::time::Duration;

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::downstream::Downstream;
use crate::problem::Problem;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The answer for a call to `downstream` that failed with `status`, by what the code
/// promises about the work below: `DEADLINE_EXCEEDED` (the budget ran out, nothing was
/// done), `UNAVAILABLE` and `RESOURCE_EXHAUSTED` (refused, nothing was done), and
/// `UNKNOWN`, which promises nothing (a server past its point of no return answers it,
/// and gRPC gives it to errors with no better code): the work may or may not be done,
/// so the answer is `outcome-unknown`, never a 502 that says nothing was done.
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
        tonic::Code::Unknown => Problem::outcome_unknown(stage),
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    #[test]
    fn each_code_is_answered_by_what_it_promises_about_the_work_below() {
        let pricing = Downstream::new("pricing").unwrap();
        let deadline = Deadline::after(Duration::from_secs(1));
        for (code, answer) in [
            (Code::DeadlineExceeded, 504),
            (Code::Unavailable, 503),
            (Code::ResourceExhausted, 503),
            (Code::Unknown, 500),
            (Code::Internal, 502),
            (Code::InvalidArgument, 502),
        ] {
            let problem = problem(&Status::new(code, "below"), pricing, &deadline);
            assert_eq!(problem.status().as_u16(), answer, "{code:?}");
            assert_eq!(problem.stage(), Some(pricing.call()), "{code:?}");
        }
        // UNKNOWN: the work below may be done; the answer says so, and how to learn it.
        let unknown = problem(&Status::unknown("below"), pricing, &deadline);
        let outcome_unknown = Problem::outcome_unknown(pricing.call());
        assert_eq!(unknown.detail(), outcome_unknown.detail());
    }
}
