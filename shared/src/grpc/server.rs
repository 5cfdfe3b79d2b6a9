//! [`GrpcServerLayer`]: where a caller's `grpc-timeout` becomes a [`Deadline`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};
use tracing::Instrument as _;

use super::BoxError;
use super::body::Bounded;
use crate::deadline::{Deadline, DeadlinePolicy, NO_RETURN_GRACE};
use crate::header::{GRPC_TIMEOUT_HEADER, parse_grpc_value, read_budget, read_previous_attempts};
use crate::mode::{DeadlineMode, LiveMode, observe_requested};
use crate::stage::Stage;
use crate::timing::{Report, StageLog};

/// tonic's server starts its own timer from `grpc-timeout` just before this layer runs
/// and answers `CANCELLED` when it fires; a plain tonic client times the call out at the
/// same value and calls it `CANCELLED` too. The deadline is set sooner, so that the
/// caller learns `DEADLINE_EXCEEDED` instead: the budget is rounded down to whole
/// milliseconds, then this margin is taken off, more than a tick of tokio's timer
/// (which fires on whole milliseconds) and the answer's way back to such a client.
const BEFORE_TONIC: Duration = Duration::from_millis(5);

/// Wraps a tonic server's services so that every call runs under a [`Deadline`]:
/// handlers read it with `request.extensions().get::<Deadline>()` or
/// [`Deadline::current`], and a call made under it (through
/// [`GrpcClientLayer`](super::GrpcClientLayer)) carries it on.
///
/// ```
/// use deadline_propagation::DeadlinePolicy;
/// use deadline_propagation::grpc::GrpcServerLayer;
///
/// let layer = GrpcServerLayer::new(DeadlinePolicy::from_millis(2000, 1000));
/// // tonic::transport::Server::builder().layer(layer).add_service(PricingServer::new(..))
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct GrpcServerLayer {
    config: Arc<ServerConfig>,
}

#[derive(Clone, Debug)]
struct ServerConfig {
    policy: DeadlinePolicy,
    mode: LiveMode,
    honour_mode_header: bool,
    report: Option<Arc<dyn Report>>,
}

impl GrpcServerLayer {
    /// A layer that applies `policy` to every call, in propagate mode.
    pub fn new(policy: DeadlinePolicy) -> Self {
        Self {
            config: Arc::new(ServerConfig {
                policy,
                mode: LiveMode::new(DeadlineMode::Propagate),
                honour_mode_header: false,
                report: None,
            }),
        }
    }

    /// Runs a call marked `x-deadline-mode: observe` in observe mode (a refusal here
    /// would be a real one to an observing caller); any other value is
    /// `INVALID_ARGUMENT`. Off by default, as for the HTTP ingress
    /// ([`DeadlineLayer::honour_mode_header`](crate::DeadlineLayer::honour_mode_header)):
    /// a caller that may send it switches this service's protection off for its calls,
    /// so turn it on only where the callers are the operator's own services.
    pub fn honour_mode_header(self, honour: bool) -> Self {
        self.map(|c| c.honour_mode_header = honour)
    }

    /// Reads the mode from `mode` for every call (an admin endpoint may switch it).
    pub fn live_mode(self, mode: LiveMode) -> Self {
        self.map(|c| c.mode = mode)
    }

    /// The same layer, reporting to `report` (the metrics attach themselves this way).
    #[cfg(feature = "metrics")]
    pub(crate) fn reporting(self, report: Arc<dyn Report>) -> Self {
        self.map(|c| c.report = Some(report))
    }

    /// The policy the layer applies (the metrics export it).
    #[cfg(feature = "metrics")]
    pub(crate) fn policy(&self) -> DeadlinePolicy {
        self.config.policy
    }

    fn map(self, f: impl FnOnce(&mut ServerConfig)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        f(&mut config);
        Self {
            config: Arc::new(config),
        }
    }
}

impl<S> Layer<S> for GrpcServerLayer {
    type Service = GrpcServer<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcServer {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service made by [`GrpcServerLayer`].
#[derive(Clone, Debug)]
pub struct GrpcServer<S> {
    inner: S,
    config: Arc<ServerConfig>,
}

impl<S, B, R> Service<Request<B>> for GrpcServer<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let arrived = Instant::now();
        let config = &self.config;
        let log = Arc::new(StageLog::reporting(config.report.clone()));
        let mut mode = config.mode.get();
        if mode == DeadlineMode::Propagate && config.honour_mode_header {
            match observe_requested(request.headers()) {
                Ok(true) => mode = DeadlineMode::Observe,
                Ok(false) => {}
                Err(detail) => {
                    let detail = format!("x-deadline-mode {detail}");
                    return refuse(Status::invalid_argument(detail));
                }
            }
        }
        let headers = request.headers();
        let (requested, previous) = match (read_budget(headers), read_previous_attempts(headers)) {
            (Ok(requested), Ok(previous)) => (requested, previous),
            (Err(invalid), _) => return refuse(Status::invalid_argument(invalid.to_string())),
            (_, Err((header, detail))) => {
                let detail = format!("{header} {detail}");
                return refuse(Status::invalid_argument(detail));
            }
        };
        // A `grpc-timeout` is rounded down here (the budget headers round up, so that an
        // HTTP caller gets all it asked for; tonic's timer takes the exact value).
        let grpc = grpc_timeout_floor(headers);
        let requested = match (requested, grpc) {
            (Some(requested), Some(grpc)) => Some(requested.min(grpc)),
            _ => requested,
        };
        // No answer of ours can come after tonic's timer: it drops this layer's future.
        let last = grpc.and_then(|grpc| arrived.checked_add(grpc.saturating_sub(BEFORE_TONIC)));
        let (budget, clamped) = config.policy.accept(requested);
        log.observe_inbound(budget, clamped);
        log.observe_start(Stage::Ingress, budget);
        let budget = budget.saturating_sub(BEFORE_TONIC);
        let deadline = Deadline::with_log(arrived, budget, log)
            .with_mode(mode)
            .with_previous_attempts(previous);
        request.extensions_mut().insert(deadline.clone());
        // The server span continues the caller's trace (`traceparent` in the metadata).
        let span = tracing::info_span!(
            "grpc.server",
            otel.name = request.uri().path(),
            otel.kind = "server",
            rpc.system = "grpc",
            trace_id = tracing::field::Empty,
        );
        crate::trace::continue_trace(&span, request.headers());
        let handler = deadline.clone().scope(self.inner.call(request));
        let serve = async move {
            let observe = mode == DeadlineMode::Observe;
            let answer = match observe {
                true => {
                    let answer = handler.await;
                    if deadline.is_expired() {
                        deadline.would_refuse(Stage::Ingress, "deadline");
                    }
                    answer.map(|answer| answer.map(Body::new))
                }
                false => bounded(handler, &deadline, last).await,
            };
            deadline.log().observe_answered(deadline.instant());
            // A server stream's messages are bounded too: its body ends at the deadline.
            // An answer made in the grace after the point of no return goes out whole.
            let bound = !observe && !deadline.is_expired();
            answer.map(|answer| match bound {
                true => answer.map(|body| Bounded::wrap(body, deadline.clone(), Stage::Ingress)),
                false => answer,
            })
        };
        Box::pin(serve.instrument(span))
    }
}

/// The handler's answer by the deadline, dropping its work there: `DEADLINE_EXCEEDED`,
/// which promises that nothing was done. A handler past its point of no return (a
/// COMMIT on the wire) gets [`NO_RETURN_GRACE`] more to answer by its outcome, as at
/// the HTTP ingress (cut short by tonic's own timer, `last`, when the caller sent
/// `grpc-timeout`); still unfinished, the answer is `UNKNOWN`: nobody knows yet.
async fn bounded<F, R, E>(
    handler: F,
    deadline: &Deadline,
    last: Option<Instant>,
) -> Result<Response<Body>, E>
where
    F: Future<Output = Result<Response<R>, E>>,
    R: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    let mut handler = std::pin::pin!(handler);
    let status = match deadline.run(Stage::Ingress, handler.as_mut()).await {
        Ok(answer) => return answer.map(|answer| answer.map(Body::new)),
        Err(exceeded) if !deadline.log().past_no_return() => {
            Status::deadline_exceeded(exceeded.to_string())
        }
        Err(_) => match tokio::time::timeout_at(grace_end(deadline, last), handler).await {
            Ok(answer) => return answer.map(|answer| answer.map(Body::new)),
            Err(_) => Status::unknown(
                "the deadline passed after the point of no return: the outcome is unknown",
            ),
        },
    };
    Ok(status.into_http())
}

/// The end of the grace after the point of no return: [`NO_RETURN_GRACE`] past the
/// deadline, or tonic's timer if that comes first.
fn grace_end(deadline: &Deadline, last: Option<Instant>) -> Instant {
    let grace = deadline.instant().checked_add(NO_RETURN_GRACE);
    let end = grace.unwrap_or(deadline.instant());
    last.map_or(end, |last| end.min(last.max(deadline.instant())))
}

/// The request's `grpc-timeout`, rounded down to whole milliseconds (a malformed one was
/// refused before).
fn grpc_timeout_floor(headers: &http::HeaderMap) -> Option<Duration> {
    let grpc = parse_grpc_value(headers.get(GRPC_TIMEOUT_HEADER)?.as_bytes()).ok()?;
    Some(Duration::from_millis(
        grpc.as_millis().try_into().unwrap_or(u64::MAX),
    ))
}

/// A call refused before its handler runs: a trailers-only answer.
fn refuse<E: Send + 'static>(
    status: Status,
) -> Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>> {
    Box::pin(std::future::ready(Ok(status.into_http())))
}
