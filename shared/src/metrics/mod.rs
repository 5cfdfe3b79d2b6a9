//! Prometheus metrics with the names of the contract (docs/design.md §7).
//!
//! Each service owns one [`Metrics`] with its own registry, so two services in one test
//! process keep separate numbers. The families are grouped by what they explain:
//! - HTTP server: how long requests take, by route template, and how many are in flight;
//! - deadline: the budgets accepted, clamped, left at each stage, and where they ran out;
//! - HTTP client: the catalog call, its bulkhead's queue (pending) and slots (active);
//!   a rising pending gauge with a flat downstream latency means pool queueing, both
//!   rising means the downstream is slow;
//! - database pool and tool calls;
//! - the configuration (budget policy, pool limits, injected faults) and the process
//!   (memory, CPU), so panels and alerts compare against the limits in force rather
//!   than numbers typed into a dashboard.

mod families;
#[cfg(feature = "axum")]
mod http;
#[doc(hidden)]
pub mod names;

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;

pub(crate) use families::{
    AttemptKind, AttemptOutcome, ClientMetrics, DbMetrics, DeadlineMetrics, HttpServerMetrics,
    PoolGauges, RejectReason, ToolMetrics,
};
pub(crate) use families::{PoolLimits, SettingsMetrics};

/// What the latency estimate is written to.
pub(crate) type FloatGauge =
    prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>;
/// What a pool's pending count is written to.
pub(crate) type IntGauge = prometheus_client::metrics::gauge::Gauge;
#[cfg(feature = "axum")]
pub(crate) use http::track_http;

type ScrapeHook = Box<dyn Fn() + Send + Sync>;

/// All metrics of one service, cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    http: HttpServerMetrics,
    deadline: DeadlineMetrics,
    client: ClientMetrics,
    db: DbMetrics,
    tools: ToolMetrics,
    settings: SettingsMetrics,
    on_scrape: Mutex<Vec<ScrapeHook>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with every contract family; `service` labels the deadline metrics.
    pub fn new(service: &'static str) -> Self {
        Self::with_registry(service, |_| {})
    }

    /// The families of [`Metrics::new`], and whatever `register` adds to the same
    /// registry (a collector of your own, a gauge only one service has), so one scrape
    /// shows them all.
    pub fn with_registry(service: &'static str, register: impl FnOnce(&mut Registry)) -> Self {
        let mut registry = Registry::default();
        let http = HttpServerMetrics::register(&mut registry);
        let deadline = DeadlineMetrics::register(&mut registry, service);
        let client = ClientMetrics::register(&mut registry, deadline.clone());
        let db = DbMetrics::register(&mut registry);
        let tools = ToolMetrics::register(&mut registry);
        let settings = SettingsMetrics::register(&mut registry, service);
        register(&mut registry);
        Self {
            inner: Arc::new(Inner {
                registry,
                http,
                deadline,
                client,
                db,
                tools,
                settings,
                on_scrape: Mutex::default(),
            }),
        }
    }

    /// HTTP server families.
    pub(crate) fn http(&self) -> &HttpServerMetrics {
        &self.inner.http
    }

    /// Deadline families, labelled with this service's name.
    pub(crate) fn deadline(&self) -> &DeadlineMetrics {
        &self.inner.deadline
    }

    /// Outbound HTTP client families.
    pub(crate) fn client(&self) -> &ClientMetrics {
        &self.inner.client
    }

    /// Database pool gauges.
    pub(crate) fn db(&self) -> &DbMetrics {
        &self.inner.db
    }

    /// Tool call counter.
    pub(crate) fn tools(&self) -> &ToolMetrics {
        &self.inner.tools
    }

    /// The configuration exported as metrics (budget policy, pool limits).
    pub(crate) fn settings(&self) -> &SettingsMetrics {
        &self.inner.settings
    }

    /// Makes the series of `downstream`'s stages exist from the first scrape, as a
    /// client built with these metrics does; for a service that reports a
    /// downstream's stages without calling it.
    pub fn declare_downstream(&self, downstream: crate::Downstream) {
        self.inner.deadline.init_downstream(downstream);
    }

    /// Makes the `tool_calls_total` series of each tool in `names` exist from the
    /// first scrape, one per outcome.
    pub fn declare_tools<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        self.inner.tools.init(names);
    }

    /// Runs `hook` before every scrape, to copy a value that lives elsewhere (a pool's
    /// idle count) into a gauge.
    pub fn on_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.hooks().push(Box::new(hook));
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
        for hook in self.hooks().iter() {
            hook();
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// `GET /metrics`, to merge into a service's router.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn router(&self) -> axum::Router {
        axum::Router::new()
            .route("/metrics", axum::routing::get(serve_metrics))
            .with_state(self.clone())
    }

    fn hooks(&self) -> std::sync::MutexGuard<'_, Vec<ScrapeHook>> {
        self.inner
            .on_scrape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(feature = "axum")]
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
