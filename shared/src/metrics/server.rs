//! The ingress with metrics: [`instrument`], which stacks the deadline layer, the HTTP
//! server middleware and `GET /metrics` on a router, and the middleware itself: the
//! request's server span (continuing the caller's trace), request time and in-flight
//! count by route template, and the one log line of every failed request.
//!
//! The middleware sits *outside* the deadline layer, so requests that time out are
//! measured too, and both are route layers, so `MatchedPath` is known (the `uri` label
//! is the template, `/api/orders/{id}`, never the raw path, which would make one series
//! per order).
//!
//! Every label value comes from a fixed set, whatever a client sends: the
//! method is one of the standard ones or `_OTHER` (as OpenTelemetry's HTTP conventions
//! spell it), and a path without a route template of its own (a nested service's tail)
//! is [`UNMATCHED`]. Otherwise a scanner inventing a method per request would add a
//! series per request, until the service or Prometheus runs out of memory.

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use tokio::time::Instant;
use tracing::Instrument;

use super::Metrics;
use crate::ingress::DeadlineLayer;
use crate::problem::ProblemReport;

/// The path of the scrape endpoint [`instrument`] adds.
const METRICS_PATH: &str = "/metrics";

/// Puts every route of `router` under `layer` (reporting to `metrics`), wraps that in
/// the HTTP metrics middleware, and adds `GET /metrics` (a probe of the layer's): the
/// one way to stack them.
///
/// ```
/// use axum::{Router, routing::get};
/// use deadline_propagation::{DeadlineLayer, DeadlinePolicy, instrument, metrics::Metrics};
///
/// let metrics = Metrics::new("inventory");
/// let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(2000, 1000)).probes(["/healthz"]);
/// let app: Router = instrument(Router::new().route("/healthz", get(|| async { "ok" })), layer, &metrics);
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn instrument(router: axum::Router, layer: DeadlineLayer, metrics: &Metrics) -> axum::Router {
    let router = router.route_layer(layer.probes([METRICS_PATH]).with_metrics(metrics));
    measure(router, metrics)
}

/// What [`instrument`] adds but the deadline layer: the HTTP server middleware and
/// `GET /metrics`, for routes served without the technique (a service's code path
/// beside it), measured in the same families.
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn measure(router: axum::Router, metrics: &Metrics) -> axum::Router {
    let scrape = axum::Router::new()
        .route(METRICS_PATH, axum::routing::get(serve_metrics))
        .with_state(metrics.clone());
    router
        .route_layer(axum::middleware::from_fn_with_state(
            metrics.clone(),
            track_http,
        ))
        .merge(scrape)
}

impl DeadlineLayer {
    /// The same layer, reporting budgets, clamps, stage starts and expiries to
    /// `metrics`, and exporting its policy (`deadline_policy_seconds`).
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn with_metrics(self, metrics: &Metrics) -> Self {
        let policy = self.policy();
        metrics
            .settings()
            .set_deadline_policy(policy.max(), policy.default_budget());
        self.reporting(metrics.deadline_report())
    }
}

#[cfg(feature = "grpc")]
impl crate::grpc::GrpcServerLayer {
    /// The same layer, reporting to `metrics` as [`DeadlineLayer::with_metrics`] does.
    #[cfg_attr(docsrs, doc(cfg(all(feature = "metrics", feature = "grpc"))))]
    pub fn with_metrics(self, metrics: &Metrics) -> Self {
        let policy = self.policy();
        metrics
            .settings()
            .set_deadline_policy(policy.max(), policy.default_budget());
        self.reporting(metrics.deadline_report())
    }
}

async fn serve_metrics(
    axum::extract::State(metrics): axum::extract::State<Metrics>,
) -> impl axum::response::IntoResponse {
    (
        [(
            ::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(),
    )
}

/// The `uri` label of a request without a route template of its own.
const UNMATCHED: &str = "unmatched";

/// The `method` label: the method's name when it is one of the nine of RFC 9110 and
/// RFC 5789, else `_OTHER`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "_OTHER",
    }
}

/// Measures one request; used with `axum::middleware::from_fn_with_state`.
async fn track_http(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    let uri = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED, MatchedPath::as_str)
        .to_owned();
    let method = method_label(request.method());
    let span = tracing::info_span!(
        "http.server",
        otel.name = %format_args!("{method} {uri}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %uri,
        http.response.status_code = tracing::field::Empty,
        deadline.budget_ms = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    crate::trace::continue_trace(&span, request.headers());
    time_request(metrics, uri, method, request, next)
        .instrument(span)
        .await
}

async fn time_request(
    metrics: Metrics,
    uri: String,
    method: &'static str,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    // The guard lowers the gauge even when the client goes away and hyper drops this
    // future half-way: in-flight must return to 0 after cancelled requests.
    let _in_flight = InFlight::enter(&metrics, &uri);
    let response = next.run(request).await;
    let status = response.status();
    crate::ingress::record_on_current_span("http.response.status_code", u64::from(status.as_u16()));
    metrics
        .http()
        .observe_request(method, &uri, status.as_str(), started.elapsed());
    if let Some(report) = response.extensions().get::<ProblemReport>() {
        log_problem(&uri, report);
    }
    response
}

/// Deadline answers are the system working as designed, so they are logged at `info`;
/// early refusals (503) at `debug`, since under overload they are the high-volume fast
/// path and `http_client_pool_rejections_total` already counts them; a failing
/// dependency at `warn`; only our own faults at `error`.
fn log_problem(uri: &str, report: &ProblemReport) {
    let status = report.status.as_u16();
    let stage = report.stage.map(|s| s.as_str());
    let cause = report.cause.as_deref();
    match status {
        503 => tracing::debug!(uri, status, stage, cause, "request refused early"),
        504 => tracing::info!(uri, status, stage, cause, "request timed out"),
        502 => tracing::warn!(uri, status, stage, cause, "dependency failed"),
        500..=599 => tracing::error!(uri, status, cause, "request failed"),
        _ => tracing::debug!(uri, status, "client error"),
    }
}

struct InFlight {
    gauge: crate::metrics::IntGauge,
}

impl InFlight {
    fn enter(metrics: &Metrics, uri: &str) -> Self {
        let gauge = metrics.http().in_flight(uri);
        gauge.inc();
        Self { gauge }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_methods_keep_their_names_and_any_other_is_other() {
        for name in [
            "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
        ] {
            assert_eq!(
                method_label(&Method::from_bytes(name.as_bytes()).unwrap()),
                name
            );
        }
        for name in ["BREW", "get", "PROPFIND", "X-SCAN-1"] {
            assert_eq!(
                method_label(&Method::from_bytes(name.as_bytes()).unwrap()),
                "_OTHER"
            );
        }
    }
}
