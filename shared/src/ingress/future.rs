//! [`ResponseFuture`]: the handler raced against the deadline.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::response::IntoResponse;
use http::{HeaderName, HeaderValue, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use crate::deadline::Deadline;
use crate::problem::Problem;
use crate::stage::Stage;

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
            // None in legacy mode: nothing bounds the handler.
            #[pin]
            timer: Option<Sleep>,
            deadline: Deadline,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn reject(response: axum::response::Response) -> Self {
        Self {
            kind: Kind::Reject {
                response: Some(response),
            },
        }
    }

    pub(crate) fn bounded(handler: F, deadline: Deadline) -> Self {
        Self {
            kind: Kind::Run {
                handler,
                timer: Some(tokio::time::sleep_until(deadline.instant())),
                deadline,
            },
        }
    }

    pub(crate) fn unbounded(handler: F, deadline: Deadline) -> Self {
        Self {
            kind: Kind::Run {
                handler,
                timer: None,
                deadline,
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
                timer,
                deadline,
            } => {
                // The handler goes first: an answer that is ready at the deadline is
                // still a good answer.
                if let Poll::Ready(result) = handler.poll(cx) {
                    let response = result?.map(axum::body::Body::new);
                    return Poll::Ready(Ok(with_server_timing(response, deadline)));
                }
                if let Some(timer) = timer.as_pin_mut() {
                    ready!(timer.poll(cx));
                    let response =
                        Problem::deadline(deadline.exceeded(Stage::Ingress)).into_response();
                    return Poll::Ready(Ok(with_server_timing(response, deadline)));
                }
                Poll::Pending
            }
        }
    }
}

fn with_server_timing(
    mut response: axum::response::Response,
    deadline: &Deadline,
) -> axum::response::Response {
    let value = deadline.log().server_timing(deadline.elapsed());
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().append(SERVER_TIMING, value);
    }
    response
}
