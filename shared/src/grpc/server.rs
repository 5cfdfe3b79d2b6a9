//! [`GrpcServerLayer`]: where a caller's `grpc-timeout` becomes a [`Deadline`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tonic::Status;
use tower::{Layer, Service};
use tracing::Instrument as _;

use crate::deadline::{Deadline, DeadlinePolicy};
use crate::header::{read_budget, read_previous_attempts};
use crate::mode::{DeadlineMode, LiveMode, observe_requested};
use crate::stage::Stage;
use crate::timing::{Report, StageLog};

/// tonic's server starts its own timer from `grpc-timeout` just before this layer runs
/// and answers `CANCELLED` when it fires; the deadline is set one tick of tokio's timer
/// sooner, so that the caller learns `DEADLINE_EXCEEDED` instead.
const BEFORE_TONIC: Duration = Duration::from_millis(1);

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
    report: Option<Arc<dyn Report>>,
}

impl GrpcServerLayer {
    /// A layer that applies `policy` to every call, in propagate mode; a caller marked
    /// `x-deadline-mode: observe` is observed (gRPC services are called by services).
    pub fn new(policy: DeadlinePolicy) -> Self {
        Self {
            config: Arc::new(ServerConfig {
                policy,
                mode: LiveMode::new(DeadlineMode::Propagate),
                report: None,
            }),
        }
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
    R: Default + Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let arrived = Instant::now();
        let config = &self.config;
        let log = Arc::new(StageLog::reporting(config.report.clone()));
        let mut mode = config.mode.get();
        if observe_requested(request.headers()) == Ok(true) {
            mode = DeadlineMode::Observe;
        }
        let headers = request.headers();
        let (requested, previous) = match (read_budget(headers), read_previous_attempts(headers)) {
            (Ok(requested), Ok(previous)) => (requested, previous),
            (Err(invalid), _) => return refuse(Status::invalid_argument(invalid.to_string())),
            (_, Err(detail)) => {
                let detail = format!("x-previous-attempts {detail}");
                return refuse(Status::invalid_argument(detail));
            }
        };
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
            let answer = if mode == DeadlineMode::Observe {
                let answer = handler.await;
                if deadline.is_expired() {
                    deadline.would_refuse(Stage::Ingress, "deadline");
                }
                answer
            } else {
                // Dropping the handler at the deadline drops its work: nothing polls it
                // again.
                match deadline.run(Stage::Ingress, handler).await {
                    Ok(answer) => answer,
                    Err(exceeded) => {
                        Ok(Status::deadline_exceeded(exceeded.to_string()).into_http())
                    }
                }
            };
            deadline.log().observe_answered(deadline.instant());
            answer
        };
        Box::pin(serve.instrument(span))
    }
}

/// A call refused before its handler runs: a trailers-only answer.
fn refuse<R: Default + Send + 'static, E: Send + 'static>(
    status: Status,
) -> Pin<Box<dyn Future<Output = Result<Response<R>, E>> + Send>> {
    Box::pin(std::future::ready(Ok(status.into_http())))
}
