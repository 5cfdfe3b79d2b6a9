//! [`DeadlineService`]: builds the request's [`Deadline`] and starts the race.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::MatchedPath;
use http::{Request, Response};
use tokio::time::Instant;
use tower::Service;

use super::current_span;
use super::future::ResponseFuture;
use super::layer::IngressConfig;
use crate::deadline::Deadline;
use crate::header::{DEADLINE_MODE_HEADER_DISPLAY, observe_requested, read_budget};
use crate::mode::DeadlineMode;
use crate::problem::Problem;
use crate::stage::Stage;

/// The service made by [`DeadlineLayer`](super::DeadlineLayer).
#[derive(Clone, Debug)]
pub struct DeadlineService<S> {
    inner: S,
    config: Arc<IngressConfig>,
}

impl<S> DeadlineService<S> {
    pub(crate) fn new(inner: S, config: Arc<IngressConfig>) -> Self {
        Self { inner, config }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for DeadlineService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let arrived = Instant::now();
        let config = &self.config;
        let log = Arc::new(config.stage_log(is_probe(&request, &config.probes)));

        // Read once: the whole request runs in the mode in force when it arrived, or in
        // observe when an observing caller asks for it and this service honours that.
        let mut mode = config.mode.get();
        if mode == DeadlineMode::Propagate && config.honour_mode_header {
            match observe_requested(request.headers()) {
                Ok(true) => mode = DeadlineMode::Observe,
                Ok(false) => {}
                Err(invalid) => {
                    let problem = Problem::invalid_header(DEADLINE_MODE_HEADER_DISPLAY, invalid);
                    return ResponseFuture::refuse(problem, &log, arrived);
                }
            }
        }
        // Every budget header counts (ours, grpc-timeout, Envoy's): the smallest wins.
        let (requested, invalid) = match read_budget(request.headers()) {
            Ok(requested) => (requested, false),
            // Observe refuses nothing: the default budget stands in, and the 400 that
            // propagate would answer is counted below.
            Err(_) if mode == DeadlineMode::Observe => (None, true),
            Err(invalid) => {
                let problem = Problem::invalid_header(invalid.header(), invalid.to_string());
                return ResponseFuture::refuse(problem, &log, arrived);
            }
        };
        let (budget, clamped) = config.policy.accept(requested);
        log.observe_inbound(budget, clamped);
        let deadline = Deadline::with_log(arrived, budget, log).with_mode(mode);
        if invalid {
            deadline.would_refuse(Stage::Ingress, "invalid_header");
        }
        deadline.log().observe_start(Stage::Ingress, budget);
        // The server span (opened by the HTTP middleware) declares this field.
        current_span::record("deadline.budget_ms", budget.as_millis() as u64);
        request.extensions_mut().insert(deadline.clone());
        if mode == DeadlineMode::Observe {
            return ResponseFuture::observed(self.inner.call(request), deadline);
        }
        ResponseFuture::bounded(self.inner.call(request), deadline)
    }
}

/// Whether `request` is for one of the layer's `probes`: by its route template when
/// routing has run (the layer is a route layer), else by its path.
fn is_probe<B>(request: &Request<B>, probes: &[&str]) -> bool {
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(request.uri().path(), MatchedPath::as_str);
    probes.contains(&path)
}
