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
pub mod names;

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;

pub use families::{
    ClientMetrics, DbMetrics, DeadlineMetrics, HttpServerMetrics, PoolGauges, RejectReason,
    ToolMetrics,
};
pub use families::{PoolLimits, SettingsMetrics};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use http::track_http;

type ScrapeHook = Box<dyn Fn() + Send + Sync>;

/// All metrics of one service, cheap to clone.
///
/// ```
/// use shared::metrics::Metrics;
///
/// let metrics = Metrics::new("orders-service");
/// metrics.tools().count("catalog_lookup", "ok");
/// assert!(metrics.render().contains("tool_calls_total{tool_name=\"catalog_lookup\",outcome=\"ok\"} 1"));
/// ```
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
    ///
    /// ```
    /// // One registry per service: two services in one test process keep separate numbers.
    /// let orders = shared::metrics::Metrics::new("orders-service");
    /// let catalog = shared::metrics::Metrics::new("catalog-service");
    /// ```
    pub fn new(service: &'static str) -> Self {
        let mut registry = Registry::default();
        let http = HttpServerMetrics::register(&mut registry);
        let deadline = DeadlineMetrics::register(&mut registry, service);
        let client = ClientMetrics::register(&mut registry, deadline.clone());
        let db = DbMetrics::register(&mut registry);
        let tools = ToolMetrics::register(&mut registry);
        let settings = SettingsMetrics::register(&mut registry, service);
        registry.register_collector(Box::new(families::ProcessCollector));
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
    ///
    /// ```
    /// let metrics = shared::metrics::Metrics::new("catalog-service");
    /// let http = metrics.http().clone(); // moved by the HTTP middleware
    /// ```
    pub fn http(&self) -> &HttpServerMetrics {
        &self.inner.http
    }

    /// Deadline families, labelled with this service's name.
    ///
    /// ```
    /// use shared::{DeadlineLayer, DeadlinePolicy, metrics::Metrics};
    ///
    /// let metrics = Metrics::new("catalog-service");
    /// let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(5000, 5000))
    ///     .metrics(metrics.deadline().clone());
    /// ```
    pub fn deadline(&self) -> &DeadlineMetrics {
        &self.inner.deadline
    }

    /// Outbound HTTP client families.
    ///
    /// ```
    /// let metrics = shared::metrics::Metrics::new("orders-service");
    /// // Handed to `BudgetedClient::new`, which registers its series under its name.
    /// let client_metrics = Some(metrics.client().clone());
    /// ```
    pub fn client(&self) -> &ClientMetrics {
        &self.inner.client
    }

    /// Database pool gauges.
    ///
    /// ```
    /// let metrics = shared::metrics::Metrics::new("orders-service");
    /// metrics.db().set_connections(3, 1);
    /// assert!(metrics.render().contains("db_pool_connections{state=\"in_use\"} 1"));
    /// ```
    pub fn db(&self) -> &DbMetrics {
        &self.inner.db
    }

    /// Tool call counter.
    ///
    /// ```
    /// let metrics = shared::metrics::Metrics::new("orders-service");
    /// metrics.tools().init(["catalog_lookup", "inventory_check"]);
    /// ```
    pub fn tools(&self) -> &ToolMetrics {
        &self.inner.tools
    }

    /// The configuration exported as metrics (budget policy, pool limits, faults).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let metrics = shared::metrics::Metrics::new("catalog-service");
    /// metrics.settings().set_fault_delay(Duration::from_secs(1));
    /// assert!(metrics.render().contains("catalog_fault_delay_seconds 1.0"));
    /// ```
    pub fn settings(&self) -> &SettingsMetrics {
        &self.inner.settings
    }

    /// Runs `hook` before every scrape, to copy a value that lives elsewhere (the sqlx
    /// pool's idle count) into a gauge.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    ///
    /// let metrics = shared::metrics::Metrics::new("orders-service");
    /// let scrapes = Arc::new(AtomicUsize::new(0));
    /// let counter = Arc::clone(&scrapes);
    /// metrics.on_scrape(move || {
    ///     counter.fetch_add(1, Ordering::Relaxed);
    /// });
    /// metrics.render();
    /// assert_eq!(scrapes.load(Ordering::Relaxed), 1);
    /// ```
    pub fn on_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.hooks().push(Box::new(hook));
    }

    /// The registry in the OpenMetrics text format.
    ///
    /// ```
    /// let text = shared::metrics::Metrics::new("orders-service").render();
    /// assert!(text.ends_with("# EOF\n"));
    /// ```
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
    ///
    /// ```
    /// use axum::{Router, routing::get};
    ///
    /// let metrics = shared::metrics::Metrics::new("catalog-service");
    /// let app: Router = Router::new()
    ///     .route("/healthz", get(|| async { "ok" }))
    ///     .merge(metrics.router());
    /// ```
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
