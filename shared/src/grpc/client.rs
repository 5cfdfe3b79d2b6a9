//! [`GrpcClientLayer`]: the request's budget sent on as `grpc-timeout`.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, Request, Response};
use http_body_util::{BodyExt as _, Full};
use tonic::body::Body;
use tonic::{Code, Status};
use tower::{Layer, Service};
use tracing::Instrument as _;

use crate::deadline::{Deadline, DeadlineExceeded};
use crate::downstream::Downstream;
use crate::header::PREVIOUS_ATTEMPTS_HEADER;
use crate::mode::{DEADLINE_MODE_HEADER, DeadlineMode, OBSERVE};
use crate::stage::Stage;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
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
            }),
        }
    }

    /// What is kept back from every budget sent: the answer's way back.
    pub fn reserve(self, reserve: Duration) -> Self {
        self.map(|c| c.reserve = reserve)
    }

    /// Sends an `UNAVAILABLE` call once more while time is left, unless a caller above
    /// owns retries for the request (it sent `x-previous-attempts`): one layer retries,
    /// so a failing service sees one call per attempt of the top, not their product.
    pub fn retry_unavailable(self, retry: bool) -> Self {
        self.map(|c| c.retry = retry)
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
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The service made ready is the one to call; the next call gets a fresh clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        let deadline = (request.extensions().get::<Deadline>().cloned()).or_else(Deadline::current);
        Box::pin(async move {
            match deadline {
                // No deadline here: tonic's own behaviour, untouched.
                None => inner.call(request).await.map_err(Into::into),
                Some(deadline) => {
                    let span = tracing::info_span!(
                        "grpc.client",
                        otel.name = request.uri().path(),
                        otel.kind = "client",
                        rpc.system = "grpc",
                        deadline.remaining_ms = deadline.remaining().as_millis() as u64,
                    );
                    send(inner, request, &deadline, &config)
                        .instrument(span)
                        .await
                }
            }
        })
    }
}

/// The call, and a retry of an `UNAVAILABLE` if this hop owns retries and time is left.
async fn send<S, R>(
    mut inner: S,
    request: Request<Body>,
    deadline: &Deadline,
    config: &ClientConfig,
) -> Result<Response<R>, BoxError>
where
    S: Service<Request<Body>, Response = Response<R>>,
    S::Error: Into<BoxError>,
{
    let stage = config.downstream.call();
    let observe = deadline.mode() == DeadlineMode::Observe;
    let above = deadline.previous_attempts();
    let owns_retries = above.is_none() || config.every_hop;
    let (mut head, body) = request.into_parts();
    // Buffered, so that a retry can send it again (a unary request is one message).
    let body = body.collect().await?.to_bytes();
    crate::trace::inject(&tracing::Span::current(), &mut head.headers);
    let mut nth = 0;
    loop {
        let mut head = head.clone();
        let left = deadline.outbound_millis(config.reserve);
        set_budget(&mut head.headers, left, observe);
        let previous = above.unwrap_or(0) + nth;
        head.headers
            .insert(PREVIOUS_ATTEMPTS_HEADER, previous.into());
        if left.is_none() && !observe {
            return Err(spent(deadline, stage));
        }
        poll_fn(|cx| inner.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        let call = inner.call(Request::from_parts(
            head,
            Body::new(Full::new(body.clone())),
        ));
        let outcome = match observe {
            // Observe refuses nothing: it counts what propagate would have refused.
            true => {
                let answer = call.await;
                if deadline.is_expired() {
                    deadline.would_refuse(stage, "deadline");
                }
                answer
            }
            false => deadline.run(stage, call).await.map_err(exceeded)?,
        };
        // tonic's channel times the call out itself at the `grpc-timeout` we sent, just
        // before the server's DEADLINE_EXCEEDED can arrive, and calls that CANCELLED: an
        // error once the time sent is spent is the budget's, and is said so.
        let outcome = outcome.map_err(|error| match deadline.outbound_millis(config.reserve) {
            None if !observe => spent(deadline, stage),
            _ => error.into(),
        });
        let unavailable =
            matches!(&outcome, Ok(answer) if code(answer.headers()) == Some(Code::Unavailable));
        let retry = config.retry && owns_retries && nth == 0 && !observe && unavailable;
        if !retry
            || deadline
                .outbound_millis(config.reserve + MIN_RETRY_LEFT)
                .is_none()
        {
            return outcome;
        }
        tracing::debug!(stage = stage.as_str(), "retrying an UNAVAILABLE call");
        nth += 1;
    }
}

/// The least time worth a retry, beyond the reserve.
const MIN_RETRY_LEFT: Duration = Duration::from_millis(20);

/// `grpc-timeout` from what is left, or (observe) the marker instead: an observing
/// caller refuses nothing, and tonic's server would enforce a `grpc-timeout` it saw.
fn set_budget(headers: &mut HeaderMap, left: Option<u64>, observe: bool) {
    headers.remove(GRPC_TIMEOUT);
    match (observe, left) {
        (true, _) => drop(headers.insert(DEADLINE_MODE_HEADER, OBSERVE)),
        (false, Some(ms)) => drop(headers.insert(GRPC_TIMEOUT, super::grpc_timeout(ms))),
        (false, None) => {}
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
