//! [`ResponseFuture`]: the handler raced against the deadline.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::response::IntoResponse;
use http::{HeaderName, HeaderValue, Response};
use pin_project_lite::pin_project;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::deadline::{Deadline, NO_RETURN_GRACE};
use crate::problem::Problem;
use crate::stage::Stage;
use crate::timing::StageLog;

const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

pin_project! {
    /// Resolves to the handler's response, or to a 504 `ingress` problem if the
    /// deadline fires first. Dropping the handler's future is what cancels its work.
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
            handler: F,
            // None once observe mode has counted the deadline passing.
            #[pin]
            timer: Option<Sleep>,
            deadline: Deadline,
            // Set once the timer has been pushed back for a step past its point of no
            // return (a COMMIT on the wire).
            extended: bool,
            // Observe mode: the timer only counts the 504 propagate would answer.
            observe: bool,
        },
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F> ResponseFuture<F> {
    /// A refusal before the handler runs (a malformed header). Like every answer it
    /// says where its time went: only `total`, since no stage ran.
    pub(crate) fn refuse(problem: Problem, log: &StageLog, arrived: Instant) -> Self {
        let response = with_server_timing(problem.into_response(), log, arrived.elapsed());
        Self {
            kind: Kind::Reject {
                response: Some(response),
            },
        }
    }

    pub(crate) fn bounded(handler: F, deadline: Deadline) -> Self {
        let timer = tokio::time::sleep_until(deadline.instant());
        Self::run(handler, deadline, Some(timer), false)
    }

    /// Observe mode: the handler runs to its end, and the deadline passing is counted
    /// as the 504 `ingress` propagate would have answered.
    pub(crate) fn observed(handler: F, deadline: Deadline) -> Self {
        let timer = tokio::time::sleep_until(deadline.instant());
        Self::run(handler, deadline, Some(timer), true)
    }

    fn run(handler: F, deadline: Deadline, timer: Option<Sleep>, observe: bool) -> Self {
        Self {
            kind: Kind::Run {
                handler,
                timer,
                deadline,
                extended: false,
                observe,
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
        match self.project().kind.project() {
            KindProj::Reject { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after completion"))),
            KindProj::Run {
                handler,
                mut timer,
                deadline,
                extended,
                observe,
            } => {
                // The handler goes first: an answer that is ready at the deadline is
                // still a good answer.
                if let Poll::Ready(result) = handler.poll(cx) {
                    let response = result?.map(axum::body::Body::new);
                    return Poll::Ready(Ok(timed(response, deadline)));
                }
                let Some(mut sleep) = timer.as_mut().as_pin_mut() else {
                    return Poll::Pending;
                };
                ready!(sleep.as_mut().poll(cx));
                if *observe {
                    deadline.would_refuse(Stage::Ingress, "deadline");
                    // The handler, polled above, wakes this future when it is done.
                    timer.set(None);
                    return Poll::Pending;
                }
                // A COMMIT is on the wire: a 504 now would promise that nothing was
                // written, which nobody knows yet. Give the handler, which waits for
                // the outcome, a bounded grace to answer by it.
                if !*extended && deadline.log().past_no_return() {
                    *extended = true;
                    sleep.as_mut().reset(deadline.instant() + NO_RETURN_GRACE);
                    ready!(sleep.poll(cx));
                }
                let response = if *extended {
                    Problem::outcome_unknown(Stage::Ingress).into_response()
                } else {
                    Problem::deadline(deadline.exceeded(Stage::Ingress)).into_response()
                };
                Poll::Ready(Ok(timed(response, deadline)))
            }
        }
    }
}

fn timed(response: axum::response::Response, deadline: &Deadline) -> axum::response::Response {
    with_server_timing(response, deadline.log(), deadline.elapsed())
}

fn with_server_timing(
    mut response: axum::response::Response,
    log: &StageLog,
    total: Duration,
) -> axum::response::Response {
    let value = log.server_timing(total);
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().append(SERVER_TIMING, value);
    }
    response
}
