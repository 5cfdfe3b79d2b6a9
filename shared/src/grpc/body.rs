//! The bodies the layers hand on: an answer cut at the deadline, and a request body
//! that goes on after the part already read.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as _, Frame};
use tokio::time::Sleep;
use tonic::Status;
use tonic::body::Body;

use crate::deadline::Deadline;
use crate::stage::Stage;

/// A gRPC answer's body (a server stream's messages) bounded by the deadline: when it
/// fires first, the messages stop and the body ends with `DEADLINE_EXCEEDED` in its
/// trailers, which is how gRPC ends a call; the rest of the stream is dropped there.
/// Whatever came before the deadline has already reached the caller.
pub(super) struct Bounded {
    // None once cut: dropping it drops the handler's stream.
    inner: Option<Body>,
    timer: Pin<Box<Sleep>>,
    deadline: Deadline,
    stage: Stage,
}

impl Bounded {
    /// `body`, cut at `deadline` (the time counted as `stage`'s overrun).
    pub(super) fn wrap(body: Body, deadline: Deadline, stage: Stage) -> Body {
        // A body already at its end (a trailers-only answer) has nothing to bound.
        if body.is_end_stream() {
            return body;
        }
        Body::new(Self {
            inner: Some(body),
            timer: Box::pin(tokio::time::sleep_until(deadline.instant())),
            deadline,
            stage,
        })
    }
}

impl http_body::Body for Bounded {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        // The body goes first: a message ready at the deadline is still delivered.
        if let Poll::Ready(frame) = Pin::new(inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        ready!(this.timer.as_mut().poll(cx));
        this.inner = None;
        let exceeded = this.deadline.exceeded(this.stage);
        let mut trailers = HeaderMap::new();
        // A status made here always encodes: its message is our own text.
        let _ = Status::deadline_exceeded(exceeded.to_string()).add_header(&mut trailers);
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }
}

/// A request body whose first bytes were read already (to learn whether it was whole):
/// those first, then the rest as it comes.
pub(super) struct Resumed {
    read: Option<Bytes>,
    rest: Body,
}

impl Resumed {
    pub(super) fn wrap(read: Bytes, rest: Body) -> Body {
        let read = (!read.is_empty()).then_some(read);
        Body::new(Self { read, rest })
    }
}

impl http_body::Body for Resumed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(read) = self.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.rest.is_end_stream()
    }
}
