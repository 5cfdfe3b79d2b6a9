//! [`GrpcClientLayer`]: the request's budget sent on as `grpc-timeout`.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, Request, Response};
use http_body::Body as _;
use http_body_util::Full;
use tonic::body::Body;
use tonic::{Code, Status};
use tower::{Layer, Service};
use tracing::Instrument as _;

use super::BoxError;
use super::body::{Bounded, Resumed};
use crate::deadline::{Deadline, DeadlineExceeded};
use crate::downstream::Downstream;
use crate::header::{
    GRPC_PREVIOUS_ATTEMPTS_HEADER, GRPC_TIMEOUT_HEADER, PREVIOUS_ATTEMPTS_HEADER, parse_grpc_value,
};
use crate::mode::{DEADLINE_MODE_HEADER, DeadlineMode, OBSERVE};
use crate::stage::Stage;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// Wraps a tonic channel so that every call carries what is left of its deadline.
///
/// ```
/// use deadline_propagation::Downstream;
/// use deadline_propagation::grpc::GrpcClientLayer;
///
/// # fn wire<Channel>(channel: Channel) {
/// let pricing = Downstream::new("pricing").unwrap();
/// // `channel`: a `tonic::transport::Channel`
/// let channel = tower::ServiceBuilder::new()
///     .layer(GrpcClientLayer::new(pricing))
///     .service(channel);
/// // let client = PricingClient::new(channel); // nothing more at any call site
/// # let _ = channel;
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct GrpcClientLayer {
    config: Arc<ClientConfig>,
}

#[derive(Clone, Debug)]
struct ClientConfig {
    downstream: Downstream,
    reserve: Duration,
    retry: bool,
    every_hop: bool,
    idempotent: Vec<String>,
}

impl GrpcClientLayer {
    /// Calls to `downstream` (its name is the stage of their time and of their 504s),
    /// keeping back 5 ms of every budget for the answer's way back.
    pub fn new(downstream: Downstream) -> Self {
        Self {
            config: Arc::new(ClientConfig {
                downstream,
                reserve: Duration::from_millis(5),
                retry: false,
                every_hop: false,
                idempotent: Vec::new(),
            }),
        }
    }

    /// What is kept back from every budget sent: the answer's way back.
    pub fn reserve(self, reserve: Duration) -> Self {
        self.map(|c| c.reserve = reserve)
    }

    /// Sends a call once more while time is left when it cannot have done anything: a
    /// refused connection (no byte left this process), whatever the method, and an
    /// `UNAVAILABLE` answer of a method declared [`idempotent`](Self::idempotent) (a
    /// server may say `UNAVAILABLE` after it began the work). Only a unary request can
    /// be sent again (its body is kept for that); a stream is never retried. And only
    /// where no caller above owns retries for the request (it sent
    /// `x-previous-attempts`): one layer retries, so a failing service sees one call per
    /// attempt of the top, not their product.
    pub fn retry(self, retry: bool) -> Self {
        self.map(|c| c.retry = retry)
    }

    /// The methods (paths such as `/pricing.v1.Pricing/Price`) that are safe to run
    /// twice, so an `UNAVAILABLE` of theirs may be retried: what gRPC's service config
    /// calls a retry policy's methods, declared here at the channel.
    pub fn idempotent<M: Into<String>>(self, methods: impl IntoIterator<Item = M>) -> Self {
        self.map(|c| c.idempotent.extend(methods.into_iter().map(Into::into)))
    }

    /// Retries whatever the caller above does: each hop on its own, as gRPC's and
    /// Finagle's per-client retries do (kept to measure what that costs).
    pub fn retry_every_hop(self, every_hop: bool) -> Self {
        self.map(|c| c.every_hop = every_hop)
    }

    fn map(self, f: impl FnOnce(&mut ClientConfig)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        f(&mut config);
        Self {
            config: Arc::new(config),
        }
    }
}

impl<S> Layer<S> for GrpcClientLayer {
    type Service = GrpcClient<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcClient {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service made by [`GrpcClientLayer`].
#[derive(Clone, Debug)]
pub struct GrpcClient<S> {
    inner: S,
    config: Arc<ClientConfig>,
}

impl<S, R> Service<Request<Body>> for GrpcClient<S>
where
    S: Service<Request<Body>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    /// Always ready: the wait for the channel's capacity is part of each call, where the
    /// call's deadline bounds it (here no deadline is known yet).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let mut inner = self.inner.clone();
        let config = Arc::clone(&self.config);
        let deadline = (request.extensions().get::<Deadline>().cloned()).or_else(Deadline::current);
        Box::pin(async move {
            match deadline {
                // No deadline here: tonic's own behaviour, untouched.
                None => {
                    poll_fn(|cx| inner.poll_ready(cx))
                        .await
                        .map_err(Into::into)?;
                    let answer = inner.call(request).await.map_err(Into::into)?;
                    Ok(answer.map(Body::new))
                }
                Some(deadline) => {
                    let span = tracing::info_span!(
                        "grpc.client",
                        otel.name = request.uri().path(),
                        otel.kind = "client",
                        rpc.system = "grpc",
                        deadline.remaining_ms = deadline.remaining().as_millis() as u64,
                    );
                    send(inner, request, deadline, &config)
                        .instrument(span)
                        .await
                }
            }
        })
    }
}

/// The call, and a retry where one is safe, this hop owns retries and time is left.
async fn send<S, R>(
    mut inner: S,
    request: Request<Body>,
    deadline: Deadline,
    config: &ClientConfig,
) -> Result<Response<Body>, BoxError>
where
    S: Service<Request<Body>, Response = Response<R>>,
    S::Error: Into<BoxError>,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    let (stage, pool) = (config.downstream.call(), config.downstream.pool());
    let observe = deadline.mode() == DeadlineMode::Observe;
    let above = deadline.previous_attempts();
    let owns_retries = config.retry && !observe && (above.is_none() || config.every_hop);
    let (mut head, body) = request.into_parts();
    // The caller's own per-call timeout (`Request::set_timeout`) stands when it is the
    // shorter: the call then runs under that, with its time in the same log.
    let deadline = match caller_timeout(&head.headers) {
        Some(own) if !observe => deadline.child(own),
        _ => deadline,
    };
    let idempotent = config.idempotent.iter().any(|m| m == head.uri.path());
    let (mut body, again) = match owns_retries {
        true => keep_whole(body).await?,
        false => (Some(body), None),
    };
    crate::trace::inject(&tracing::Span::current(), &mut head.headers);
    let mut nth: u32 = 0;
    loop {
        let mut head = head.clone();
        let left = deadline.outbound_millis(config.reserve);
        set_budget(&mut head.headers, left, observe);
        // Sent by the hop that owns retries, and passed on from a caller above that
        // does, so that nobody below retries too; saturating, whatever the caller sent.
        let previous = match owns_retries {
            true => Some(above.unwrap_or(0).saturating_add(nth)),
            false => above,
        };
        if let Some(previous) = previous {
            for name in [PREVIOUS_ATTEMPTS_HEADER, GRPC_PREVIOUS_ATTEMPTS_HEADER] {
                head.headers.insert(name, previous.into());
            }
        }
        if left.is_none() && !observe {
            return Err(spent(&deadline, stage));
        }
        let body = match (&again, body.take()) {
            (Some(whole), _) => Body::new(Full::new(whole.clone())),
            (None, Some(body)) => body,
            (None, None) => unreachable!("a body that is not kept is sent once"),
        };
        let request = Request::from_parts(head, body);
        let outcome = match observe {
            // Observe refuses nothing: it counts what propagate would have refused.
            true => {
                let answer = call(&mut inner, request).await;
                if deadline.is_expired() {
                    deadline.would_refuse(stage, "deadline");
                }
                answer
            }
            false => {
                // The wait for the channel's capacity, then the call, each timed apart.
                let ready = poll_fn(|cx| inner.poll_ready(cx));
                let ready: Result<(), BoxError> = deadline
                    .run(pool, ready)
                    .await
                    .map_err(exceeded)?
                    .map_err(Into::into);
                match ready {
                    Ok(()) => deadline
                        .run(stage, inner.call(request))
                        .await
                        .map_err(exceeded)?
                        .map_err(Into::into),
                    Err(error) => Err(error),
                }
            }
        };
        // tonic's channel times the call out itself at the `grpc-timeout` we sent, just
        // before the server's DEADLINE_EXCEEDED can arrive, and calls that CANCELLED: an
        // error once the time sent is spent is the budget's, and is said so.
        let outcome = outcome.map_err(|error| match deadline.outbound_millis(config.reserve) {
            None if !observe => spent(&deadline, stage),
            _ => error,
        });
        let safe = match &outcome {
            Err(error) => refused(error.as_ref()),
            Ok(answer) => idempotent && code(answer.headers()) == Some(Code::Unavailable),
        };
        let retry = owns_retries && again.is_some() && nth == 0 && safe;
        if !retry
            || deadline
                .outbound_millis(config.reserve + MIN_RETRY_LEFT)
                .is_none()
        {
            return outcome.map(|answer| bound(answer, &deadline, stage, observe));
        }
        tracing::debug!(stage = stage.as_str(), "retrying a call that did nothing");
        nth += 1;
    }
}

/// One call with no deadline over it (observe mode).
async fn call<S, R>(inner: &mut S, request: Request<Body>) -> Result<Response<R>, BoxError>
where
    S: Service<Request<Body>, Response = Response<R>>,
    S::Error: Into<BoxError>,
{
    poll_fn(|cx| inner.poll_ready(cx))
        .await
        .map_err(Into::into)?;
    inner.call(request).await.map_err(Into::into)
}

/// The answer, its body (a server stream) cut at the deadline unless observing.
fn bound<R>(answer: Response<R>, deadline: &Deadline, stage: Stage, observe: bool) -> Response<Body>
where
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    answer.map(|body| match observe {
        true => Body::new(body),
        false => Bounded::wrap(Body::new(body), deadline.clone(), stage),
    })
}

/// The most of a request body kept for a retry; a larger one is sent once.
const MAX_KEPT_BYTES: usize = 64 * 1024;

/// The request's body, and a copy to send again when it is whole at once and at most
/// [`MAX_KEPT_BYTES`]: a unary request (one message, encoded when the call is made)
/// is; a client stream still being written is not, and goes on unread past what was
/// ready, never waited for. tonic's request bodies carry no trailers.
async fn keep_whole(mut body: Body) -> Result<(Option<Body>, Option<Bytes>), BoxError> {
    let mut read = BytesMut::new();
    let whole = poll_fn(|cx| {
        loop {
            match Pin::new(&mut body).poll_frame(cx) {
                Poll::Ready(None) => return Poll::Ready(Ok(true)),
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        read.extend_from_slice(&data);
                    }
                    if read.len() > MAX_KEPT_BYTES {
                        return Poll::Ready(Ok(false));
                    }
                }
                Poll::Ready(Some(Err(status))) => return Poll::Ready(Err(status)),
                Poll::Pending => return Poll::Ready(Ok(false)),
            }
        }
    })
    .await?;
    Ok(match whole {
        true => (None, Some(read.freeze())),
        false => (Some(Resumed::wrap(read.freeze(), body)), None),
    })
}

/// Whether `error` is a refused connection: the call never reached the server.
fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        cause = error.source();
    }
    false
}

/// The least time worth a retry, beyond the reserve.
const MIN_RETRY_LEFT: Duration = Duration::from_millis(20);

/// The `grpc-timeout` the caller set on this call itself, if any and valid.
fn caller_timeout(headers: &HeaderMap) -> Option<Duration> {
    parse_grpc_value(headers.get(GRPC_TIMEOUT_HEADER)?.as_bytes()).ok()
}

/// `grpc-timeout` from what is left, or (observe) the marker beside whatever the caller
/// set itself: an observing caller refuses nothing, and tonic's server would enforce a
/// `grpc-timeout` of ours that it saw.
fn set_budget(headers: &mut HeaderMap, left: Option<u64>, observe: bool) {
    if observe {
        headers.insert(DEADLINE_MODE_HEADER, OBSERVE);
        return;
    }
    headers.remove(GRPC_TIMEOUT_HEADER);
    if let Some(ms) = left {
        headers.insert(GRPC_TIMEOUT_HEADER, super::grpc_timeout(ms));
    }
}

/// The error for a call the budget did not cover: the caller's tonic client reads it
/// as `DEADLINE_EXCEEDED`.
fn spent(deadline: &Deadline, stage: Stage) -> BoxError {
    exceeded(deadline.exceeded(stage))
}

fn exceeded(exceeded: DeadlineExceeded) -> BoxError {
    Box::new(Status::deadline_exceeded(exceeded.to_string()))
}

/// The status of a trailers-only answer (how a tonic server sends an error).
fn code(headers: &HeaderMap) -> Option<Code> {
    Some(Code::from_bytes(headers.get(GRPC_STATUS)?.as_bytes()))
}
