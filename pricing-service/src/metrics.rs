//! The gRPC server's families, as the grpc-ecosystem's go-grpc-prometheus names them
//! (`grpc_server_handled_total{grpc_service, grpc_method, grpc_code}`,
//! `grpc_server_handling_seconds`), and the pricing work started and completed: the
//! difference is the work dropped at the deadline, read on the server itself.
//!
//! The labels come from this service's own method list, never from the request's path:
//! a call to any other path (a scanner, a stale client) is counted as
//! `grpc_service="other", grpc_method="other"`, so no caller can add series.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::Frame;
use tonic::body::Body;

use http::{Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tower::{Layer, Service};

use crate::proto::pricing_server::SERVICE_NAME;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Handled {
    grpc_service: &'static str,
    grpc_method: &'static str,
    grpc_code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Method {
    grpc_service: &'static str,
    grpc_method: &'static str,
}

/// The methods `pricing.proto` declares: the only method labels there are.
const METHODS: [&str; 3] = ["Price", "WatchPrice", "PriceBasket"];
/// The label of every path that is not one of [`METHODS`].
const OTHER: &str = "other";

impl Method {
    /// `/pricing.v1.Pricing/Price`: the service, then the method, if this service has it.
    fn of(path: &str) -> Self {
        let (service, method) = path
            .strip_prefix('/')
            .and_then(|path| path.split_once('/'))
            .unwrap_or_default();
        let known = METHODS.iter().find(|known| **known == method);
        match known {
            Some(method) if service == SERVICE_NAME => Self {
                grpc_service: SERVICE_NAME,
                grpc_method: method,
            },
            _ => Self {
                grpc_service: OTHER,
                grpc_method: OTHER,
            },
        }
    }
}

/// The families; clones share them.
#[derive(Clone, Debug)]
pub struct GrpcMetrics {
    handled: Family<Handled, Counter>,
    handling: Family<Method, Histogram>,
    /// Prices whose work began (after the injected faults' refusal).
    pub work_started: Counter,
    /// Prices whose work ran to its end; a call dropped at its deadline never gets here.
    pub work_completed: Counter,
}

impl GrpcMetrics {
    /// The families, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            handled: Family::default(),
            handling: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 14))
            }),
            work_started: Counter::default(),
            work_completed: Counter::default(),
        };
        registry.register(
            "grpc_server_handled",
            "gRPC calls completed, by service, method and status code",
            metrics.handled.clone(),
        );
        registry.register(
            "grpc_server_handling_seconds",
            "Time from a gRPC call's arrival to its answer",
            metrics.handling.clone(),
        );
        registry.register(
            "pricing_work_started",
            "Prices whose work began",
            metrics.work_started.clone(),
        );
        registry.register(
            "pricing_work_completed",
            "Prices whose work ran to its end (started less completed: dropped at a deadline)",
            metrics.work_completed.clone(),
        );
        metrics
    }
}

impl<S> Layer<S> for GrpcMetrics {
    type Service = Measured<S>;

    fn layer(&self, inner: S) -> Measured<S> {
        Measured {
            inner,
            metrics: self.clone(),
        }
    }
}

/// The service [`GrpcMetrics`] makes: outside the deadline layer, so its
/// `DEADLINE_EXCEEDED` answers are counted. A call is counted with its final status
/// (a stream's, from its trailers) and timed to its end.
#[derive(Clone, Debug)]
pub struct Measured<S> {
    inner: S,
    metrics: GrpcMetrics,
}

impl<S, B, R> Service<Request<B>> for Measured<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut tally = Tally {
            metrics: self.metrics.clone(),
            labels: Method::of(request.uri().path()),
            start: Instant::now(),
            counted: false,
        };
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = match call.await {
                Ok(response) => response,
                Err(error) => {
                    tally.count("UNKNOWN");
                    return Err(error);
                }
            };
            // A call that fails at once answers trailers-only: its status is in the head.
            // Otherwise the status comes in the trailers, after the last message.
            if let Some(code) = response.headers().get(GRPC_STATUS) {
                tally.count(code_name(tonic::Code::from_bytes(code.as_bytes())));
            }
            Ok(response.map(|inner| {
                Body::new(Counted {
                    inner: Body::new(inner),
                    tally,
                })
            }))
        })
    }
}

const GRPC_STATUS: &str = "grpc-status";

/// One call's count, made once: when its status is known, or, dropped before that (the
/// caller gone, tonic's own timer), as `CANCELLED`.
struct Tally {
    metrics: GrpcMetrics,
    labels: Method,
    start: Instant,
    counted: bool,
}

impl Tally {
    fn count(&mut self, code: &'static str) {
        if std::mem::replace(&mut self.counted, true) {
            return;
        }
        let seconds = self.start.elapsed().as_secs_f64();
        self.metrics
            .handling
            .get_or_create(&self.labels)
            .observe(seconds);
        let handled = Handled {
            grpc_service: self.labels.grpc_service,
            grpc_method: self.labels.grpc_method,
            grpc_code: code,
        };
        self.metrics.handled.get_or_create(&handled).inc();
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.count("CANCELLED");
    }
}

/// The answer's body, counted when its trailers (the call's status) go by: a stream's
/// status is known only at its end.
struct Counted {
    inner: Body,
    tally: Tally,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(code) = frame.trailers_ref().and_then(|t| t.get(GRPC_STATUS)) {
                    this.tally
                        .count(code_name(tonic::Code::from_bytes(code.as_bytes())));
                }
            }
            Some(Err(_)) | None => this.tally.count("UNKNOWN"),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The status code's name as gRPC spells it (`DEADLINE_EXCEEDED`).
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
