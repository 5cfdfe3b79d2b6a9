//! Prometheus metrics of the technique, one registry per service.
//!
//! Each service owns one [`Metrics`] with its own registry, so two services in one test
//! process keep separate numbers. The families ([`names`] lists them) are grouped by
//! what they explain:
//! - HTTP server: how long requests take, by route template, and how many are in flight;
//! - deadline: the budgets accepted, clamped, left at each stage, where they ran out,
//!   and how late past its own deadline each answer left (the service's promise);
//! - HTTP client: the call, its bulkhead's queue (pending) and slots (active), its
//!   attempts; a rising pending gauge with a flat downstream latency means pool
//!   queueing, both rising means the downstream is slow;
//! - database pool and tool calls;
//! - the configuration (budget policy, pool limits), so panels and alerts compare
//!   against the limits in force rather than numbers typed into a dashboard.
//!
//! The module sits on the core: the core reports to it through a trait it does not
//! know the implementer of, and the parts above it (the ingress, the client, the
//! database envelope, tool budgets) attach themselves with their own `with_metrics`.
//! A family exists only where its part of the crate is built.

mod families;
pub mod names;
mod server;

pub use server::{instrument, measure};

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;

#[cfg(feature = "sqlx")]
pub(crate) use families::DbMetrics;
pub(crate) use families::DeadlineMetrics;
pub(crate) use families::HttpServerMetrics;
pub(crate) use families::SettingsMetrics;
#[cfg(feature = "tools")]
pub(crate) use families::ToolMetrics;
#[cfg(feature = "http-client")]
pub(crate) use families::{ClientMetrics, ClientObserver, PoolLimits};

use crate::timing::Report;

/// A gauge that holds seconds (or any float).
pub(crate) type FloatGauge =
    prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>;
/// A gauge that counts (a pool's pending calls, requests in flight).
pub(crate) type IntGauge = prometheus_client::metrics::gauge::Gauge;

type ScrapeHook = Box<dyn Fn() + Send + Sync>;

/// All metrics of one service, cheap to clone.
///
/// ```
/// use deadline_propagation::metrics::Metrics;
///
/// let metrics = Metrics::new("inventory");
/// // Every family is there from the start, its series at 0.
/// assert!(metrics.render().contains("deadline_exceeded_total"));
/// ```
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    #[cfg(any(feature = "http-client", feature = "grpc"))]
    deadline: DeadlineMetrics,
    /// The deadline families, as the core's [`Report`].
    report: Arc<dyn Report>,
    settings: SettingsMetrics,
    #[cfg(feature = "tools")]
    tools: ToolMetrics,
    http: HttpServerMetrics,
    #[cfg(feature = "http-client")]
    client: ClientMetrics,
    #[cfg(feature = "sqlx")]
    db: DbMetrics,
    on_scrape: Mutex<Vec<ScrapeHook>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry with every family; `service` labels the deadline metrics.
    pub fn new(service: &'static str) -> Self {
        Self::with_registry(service, |_| {})
    }

    /// The families of [`Metrics::new`], and whatever `register` adds to the same
    /// registry (a collector of your own, a gauge only one service has), so one scrape
    /// shows them all.
    pub fn with_registry(service: &'static str, register: impl FnOnce(&mut Registry)) -> Self {
        let mut registry = Registry::default();
        let deadline = DeadlineMetrics::register(&mut registry, service);
        let inner = Inner {
            report: Arc::new(deadline.clone()),
            settings: SettingsMetrics::register(&mut registry, service),
            #[cfg(feature = "tools")]
            tools: ToolMetrics::register(&mut registry),
            http: HttpServerMetrics::register(&mut registry),
            #[cfg(feature = "http-client")]
            client: ClientMetrics::register(&mut registry, deadline.clone()),
            #[cfg(feature = "sqlx")]
            db: DbMetrics::register(&mut registry),
            #[cfg(any(feature = "http-client", feature = "grpc"))]
            deadline,
            on_scrape: Mutex::default(),
            registry: {
                register(&mut registry);
                registry
            },
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// HTTP server families.
    pub(crate) fn http(&self) -> &HttpServerMetrics {
        &self.inner.http
    }

    /// The deadline families, as what the core reports to.
    pub(crate) fn deadline_report(&self) -> Arc<dyn Report> {
        Arc::clone(&self.inner.report)
    }

    /// Outbound HTTP client families.
    #[cfg(feature = "http-client")]
    pub(crate) fn client(&self) -> &ClientMetrics {
        &self.inner.client
    }

    /// Database pool gauges.
    #[cfg(feature = "sqlx")]
    pub(crate) fn db(&self) -> &DbMetrics {
        &self.inner.db
    }

    /// Tool call counter.
    #[cfg(feature = "tools")]
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
    #[cfg(any(feature = "http-client", feature = "grpc"))]
    pub fn declare_downstream(&self, downstream: crate::Downstream) {
        self.inner.deadline.init_downstream(downstream);
    }

    /// Records one call to `downstream` that no budgeted client made (a code path
    /// without the technique beside one) in `http_client_requests_seconds{client,
    /// status}`, `status` being the answer's code, `timeout` or `error`.
    #[cfg(feature = "http-client")]
    pub fn observe_client_call(
        &self,
        downstream: crate::Downstream,
        status: &str,
        took: std::time::Duration,
    ) {
        self.client()
            .observe_request(downstream.name(), status, took);
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

    fn hooks(&self) -> std::sync::MutexGuard<'_, Vec<ScrapeHook>> {
        self.inner
            .on_scrape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(feature = "http-client")]
impl crate::client::BudgetedClient {
    /// The same client, reporting to `metrics`: its calls, its bulkhead's pending and
    /// active gauges (pool queueing against a slow downstream), its rejections, its
    /// attempts, its configured limits, and what its plugins know (admission's
    /// estimate, hedging's delay). Add it after the other plugins, which it reads.
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn with_metrics(self, metrics: &Metrics) -> Self {
        let config = self.config();
        let name = config.name;
        let settings = metrics.settings();
        settings.set_pool_limits(
            name.name(),
            PoolLimits {
                max_connections: config.max_connections,
                pending_max: config.pending_max,
                acquire_timeout: config.acquire_timeout,
            },
        );
        settings.set_policy_kind("reserve", config.reserve);
        let families = metrics.client().clone();
        families.init(name);
        let client = self.plugin(ClientObserver {
            client: name.name(),
            families: families.clone(),
        });
        let watched = client.clone();
        metrics.on_scrape(move || families.read(&watched));
        client
    }
}

#[cfg(feature = "sqlx")]
impl crate::db::Db {
    /// The same pool, reporting to `metrics` at each scrape: `db_pool_connections{state}`
    /// and `db_pool_pending_acquires`, the gauge that tells a queue for connections
    /// from a slow database.
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn with_metrics(self, metrics: &Metrics) -> Self {
        let families = metrics.db().clone();
        let watched = self.clone();
        metrics.on_scrape(move || families.read(&watched));
        self
    }
}

#[cfg(feature = "tools")]
impl Metrics {
    /// Makes the `tool_calls_total` series of each tool in `names` exist from the
    /// first scrape, one per outcome.
    pub fn declare_tools<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        use crate::tools::ToolOutcome;
        self.tools()
            .init(names, &ToolOutcome::ALL.map(ToolOutcome::as_str));
    }
}

#[cfg(feature = "tools")]
impl crate::tools::ToolBudget {
    /// The same budget, counting every call in `tool_calls_total{tool_name,outcome}`.
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn with_metrics(self, metrics: &Metrics) -> Self {
        let tools = metrics.tools().clone();
        self.observed(move |name, outcome| tools.count(name, outcome.as_str()))
    }
}
