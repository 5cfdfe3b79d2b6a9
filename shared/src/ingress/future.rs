//! [`ResponseFuture`]: the handler raced against the deadline.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::response::IntoResponse;
use http::{HeaderName, HeaderValue, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::deadline::{Deadline, NO_RETURN_GRACE};
use crate::mode::DeadlineMode;
use crate::problem::{Problem, ProblemReport};
use crate::stage::Stage;
use crate::timing::StageLog;

/// The handler, run with its deadline as `Deadline::current` for a gRPC client.
#[cfg(feature = "grpc")]
type Scoped<F> = tokio::task::futures::TaskLocalFuture<Deadline, F>;
#[cfg(feature = "grpc")]
fn scoped<F: Future>(handler: F, deadline: &Deadline) -> Scoped<F> {
    deadline.clone().scope(handler)
}
#[cfg(not(feature = "grpc"))]
type Scoped<F> = F;
#[cfg(not(feature = "grpc"))]
fn scoped<F>(handler: F, _: &Deadline) -> F {
    handler
}

const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

pin_project! {
    /// The handler's response, or a 504 `ingress` problem if the deadline fires first.
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Reject { response: Option<axum::response::Response> },
        Run {
            #[pin]
            handler: Scoped<F>,
            // None once observe mode has counted the deadline passing.
            #[pin]
            timer: Option<Sleep>,
            deadline: Deadline,
            // Set once the timer was pushed back for a COMMIT on the wire.
            extended: bool,
        },
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F: Future> ResponseFuture<F> {
    /// A refusal before the handler runs (a malformed header), with `Server-Timing`.
    pub(super) fn refuse(problem: Problem, log: &StageLog, arrived: Instant) -> Self {
        let response = with_server_timing(problem.into_response(), log, arrived.elapsed());
        Self {
            kind: Kind::Reject {
                response: Some(response),
            },
        }
    }

    /// The handler, bounded by `deadline` (in observe mode, only timed by it).
    pub(super) fn run(handler: F, deadline: Deadline) -> Self {
        Self {
            kind: Kind::Run {
                handler: scoped(handler, &deadline),
                timer: Some(tokio::time::sleep_until(deadline.instant())),
                deadline,
                extended: false,
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Output = Result<axum::response::Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (handler, mut timer, deadline, extended) = match self.project().kind.project() {
            KindProj::Reject { response } => {
                let response = response.take().expect("polled after completion");
                return Poll::Ready(Ok(response));
            }
            KindProj::Run {
                handler,
                timer,
                deadline,
                extended,
            } => (handler, timer, deadline, extended),
        };
        // The handler goes first: an answer ready at the deadline is still an answer.
        if let Poll::Ready(result) = handler.poll(cx) {
            let response = truthful(result?.map(axum::body::Body::new), deadline);
            return Poll::Ready(Ok(timed(response, deadline)));
        }
        let Some(mut sleep) = timer.as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        ready!(sleep.as_mut().poll(cx));
        if deadline.mode() == DeadlineMode::Observe {
            // Observe lets the handler run on and counts the 504 propagate would answer.
            deadline.would_refuse(Stage::Ingress, "deadline");
            timer.set(None);
            return Poll::Pending;
        }
        // A COMMIT is on the wire: a 504 would promise that nothing was written, which
        // nobody knows yet. The handler gets a bounded grace to answer by the outcome.
        if !*extended && deadline.log().past_no_return() {
            *extended = true;
            sleep.as_mut().reset(deadline.instant() + NO_RETURN_GRACE);
            ready!(sleep.poll(cx));
        }
        let response = match *extended || deadline.log().acted() {
            true => Problem::outcome_unknown(Stage::Ingress),
            false => Problem::deadline(deadline.exceeded(Stage::Ingress)),
        };
        Poll::Ready(Ok(timed(response.into_response(), deadline)))
    }
}

/// A 502, 503 or 504 promises that nothing was written: once a downstream may have acted
/// on a write of this request nobody knows that, and the answer says so.
fn truthful(response: axum::response::Response, deadline: &Deadline) -> axum::response::Response {
    if !matches!(response.status().as_u16(), 502..=504) || !deadline.log().acted() {
        return response;
    }
    let report = response.extensions().get::<ProblemReport>();
    Problem::outcome_unknown(report.and_then(|r| r.stage).unwrap_or(Stage::Ingress)).into_response()
}

fn timed(response: axum::response::Response, deadline: &Deadline) -> axum::response::Response {
    deadline.log().observe_answered(deadline.instant());
    with_server_timing(response, deadline.log(), deadline.elapsed())
}

fn with_server_timing(
    mut response: axum::response::Response,
    log: &StageLog,
    total: Duration,
) -> axum::response::Response {
    if let Ok(value) = HeaderValue::from_str(&log.server_timing(total)) {
        response.headers_mut().append(SERVER_TIMING, value);
    }
    response
}
