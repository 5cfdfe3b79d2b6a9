//! [`DeadlineService`]: makes the request's [`Deadline`] and starts the race.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{FromRequestParts, MatchedPath};
use http::request::Parts;
use http::{Request, Response};
use tokio::time::Instant;
use tower::Service;

use super::future::ResponseFuture;
use crate::deadline::{Deadline, DeadlinePolicy};
use crate::header::{read_budget, read_previous_attempts as read_attempts};
use crate::mode::{DEADLINE_MODE_HEADER_DISPLAY, DeadlineMode, LiveMode, observe_requested};
use crate::problem::Problem;
use crate::stage::Stage;
use crate::timing::{Report, StageLog};

/// What [`DeadlineLayer`](super::DeadlineLayer) configures.
#[derive(Clone, Debug)]
pub(super) struct IngressConfig {
    pub(super) policy: DeadlinePolicy,
    pub(super) mode: LiveMode,
    /// Whether a request may ask to be observed (`X-Deadline-Mode: observe`).
    pub(super) honour_mode_header: bool,
    /// Routes whose requests are not reported.
    pub(super) probes: Vec<&'static str>,
    pub(super) timing_stages: bool,
    pub(super) report: Option<Arc<dyn Report>>,
}

/// The service made by [`DeadlineLayer`](super::DeadlineLayer).
#[derive(Clone, Debug)]
pub struct DeadlineService<S> {
    inner: S,
    config: Arc<IngressConfig>,
}

impl<S> DeadlineService<S> {
    pub(super) fn new(inner: S, config: Arc<IngressConfig>) -> Self {
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
        // A probe's budget and stages are nobody's: its log reports nowhere.
        let report = match is_probe(&request, &config.probes) {
            true => None,
            false => config.report.clone(),
        };
        let log = Arc::new(StageLog::reporting(report).timing_stages(config.timing_stages));

        // Read once: the request runs in the mode in force when it arrived, or in observe
        // when an observing caller asks and this service honours that.
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
        let headers = request.headers();
        let (requested, previous, invalid) = match (read_budget(headers), read_attempts(headers)) {
            (Ok(requested), Ok(previous)) => (requested, previous, false),
            // Observe refuses nothing: the default stands in, the 400 is counted below.
            _ if mode == DeadlineMode::Observe => (None, None, true),
            (Err(invalid), _) => {
                let problem = Problem::invalid_header(invalid.header(), invalid.to_string());
                return ResponseFuture::refuse(problem, &log, arrived);
            }
            (_, Err((header, detail))) => {
                let problem = Problem::invalid_header(header, detail);
                return ResponseFuture::refuse(problem, &log, arrived);
            }
        };
        let (budget, clamped) = config.policy.accept(requested);
        log.observe_inbound(budget, clamped);
        let deadline = Deadline::with_log(arrived, budget, log)
            .with_mode(mode)
            .with_previous_attempts(previous);
        if invalid {
            deadline.would_refuse(Stage::Ingress, "invalid_header");
        }
        deadline.log().observe_start(Stage::Ingress, budget);
        // The server span (opened by the HTTP middleware) declares this field.
        record_on_current_span("deadline.budget_ms", budget.as_millis() as u64);
        request.extensions_mut().insert(deadline.clone());
        ResponseFuture::run(self.inner.call(request), deadline)
    }
}

/// Whether `request` is for one of `probes`: by its route template when routing has
/// run (the layer is a route layer), else by its path.
fn is_probe<B>(request: &Request<B>, probes: &[&str]) -> bool {
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(request.uri().path(), MatchedPath::as_str);
    probes.contains(&path)
}

/// Handlers take the request's `Deadline` as an argument.
impl<S: Send + Sync> FromRequestParts<S> for Deadline {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // Only a route without the layer gets here: a wiring bug, not the client's.
        parts
            .extensions
            .get::<Deadline>()
            .cloned()
            .ok_or_else(|| Problem::internal("route is missing the DeadlineLayer"))
    }
}

/// `Span::current().record(field, value)` without cloning the span in the registry:
/// every request pays it.
pub(crate) fn record_on_current_span(field: &str, value: u64) {
    tracing::dispatcher::get_default(|dispatch| {
        let Some((id, metadata)) = dispatch.current_span().into_inner() else {
            return;
        };
        let fields = metadata.fields();
        let Some(field) = fields.field(field) else {
            return;
        };
        let values = [(&field, Some(&value as &dyn tracing::Value))];
        dispatch.record(&id, &tracing::span::Record::new(&fields.value_set(&values)));
    });
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Id, Record};
    use tracing_subscriber::layer::{Context, SubscriberExt as _};

    /// A layer that keeps every `u64` recorded on a span after it opened.
    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<(String, u64)>>>);

    impl Visit for Recorded {
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.0
                .lock()
                .unwrap()
                .push((field.name().to_owned(), value));
        }
        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
        fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
            values.record(&mut self.clone());
        }
    }

    #[test]
    fn a_declared_field_is_recorded_on_the_current_span_and_nothing_else_is() {
        let recorded = Recorded::default();
        let subscriber = tracing_subscriber::registry().with(recorded.clone());
        tracing::subscriber::with_default(subscriber, || {
            // No current span: nothing to record on.
            super::record_on_current_span("budget_ms", 1);
            let span = tracing::info_span!("request", budget_ms = tracing::field::Empty);
            span.in_scope(|| {
                super::record_on_current_span("budget_ms", 700);
                super::record_on_current_span("not_declared", 2);
            });
        });
        assert_eq!(*recorded.0.lock().unwrap(), [("budget_ms".to_owned(), 700)]);
    }
}
