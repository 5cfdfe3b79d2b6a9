//! The metric families, each registered under its contract name (docs/design.md §7).
//!
//! prometheus-client appends `_total` to counters, so counters are registered without it.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::stage::Stage;

// The families added for issue 14 (configuration, process, tool-call initialisation,
// exemplars), each in its own file under families/.
mod exemplar;
mod process;
mod settings;
mod tools;

use exemplar::{LatencyHistogram, latency_histogram_with_exemplars, observe_traced};
pub(crate) use process::ProcessCollector;
pub use settings::{PoolLimits, SettingsMetrics};
pub use tools::ToolMetrics;

/// Buckets from 1 ms to 10 s, dense around the budgets this project uses (300 ms to
/// 2 s) so a p99 "within the budget" can be read off the histogram.
const LATENCY_BUCKETS: [f64; 30] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4,
    0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// Bounded: see `http::method_label`.
    pub(crate) method: &'static str,
    pub(crate) uri: String,
    pub(crate) status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct UriLabel {
    pub(crate) uri: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabel {
    service: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceStage {
    service: &'static str,
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageReason {
    service: &'static str,
    stage: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceMode {
    service: &'static str,
    mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientLabel {
    client: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientStatus {
    client: &'static str,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientReason {
    client: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// `http_server_requests_seconds` and `http_server_requests_in_flight`.
///
/// Request times carry the sampled `trace_id` as an exemplar (families/exemplar.rs).
#[derive(Clone, Debug)]
pub struct HttpServerMetrics {
    pub(crate) requests: Family<RequestLabels, LatencyHistogram, fn() -> LatencyHistogram>,
    pub(crate) in_flight: Family<UriLabel, Gauge>,
}

impl HttpServerMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            requests: Family::new_with_constructor(latency_histogram_with_exemplars),
            in_flight: Family::default(),
        };
        registry.register(
            "http_server_requests_seconds",
            "Server response time by method, route template and status",
            this.requests.clone(),
        );
        registry.register(
            "http_server_requests_in_flight",
            "Requests being handled now, by route template",
            this.in_flight.clone(),
        );
        this
    }

    /// Records one request's time, with the current trace as exemplar when sampled.
    pub(crate) fn observe_request(&self, labels: &RequestLabels, seconds: f64) {
        observe_traced(&self.requests.get_or_create(labels), seconds);
    }
}

/// The deadline families, labelled with the owning service.
#[derive(Clone, Debug)]
pub struct DeadlineMetrics {
    service: &'static str,
    inbound: Family<ServiceLabel, Histogram, fn() -> Histogram>,
    clamped: Family<ServiceLabel, Counter>,
    remaining: Family<ServiceStage, Histogram, fn() -> Histogram>,
    exceeded: Family<ServiceStage, Counter>,
    would_refuse: Family<StageReason, Counter>,
    mode: Family<ServiceMode, Gauge>,
}

impl DeadlineMetrics {
    pub(crate) fn register(registry: &mut Registry, service: &'static str) -> Self {
        let this = Self {
            service,
            inbound: Family::new_with_constructor(latency_histogram),
            clamped: Family::default(),
            remaining: Family::new_with_constructor(latency_histogram),
            exceeded: Family::default(),
            would_refuse: Family::default(),
            mode: Family::default(),
        };
        registry.register(
            "deadline_inbound_budget_seconds",
            "Budget accepted at the ingress, after clamping",
            this.inbound.clone(),
        );
        registry.register(
            "deadline_clamped",
            "Requests whose asked-for budget was clamped to [1 ms, max]",
            this.clamped.clone(),
        );
        registry.register(
            "deadline_remaining_seconds",
            "Budget left when a stage starts",
            this.remaining.clone(),
        );
        registry.register(
            "deadline_exceeded",
            "Budgets that ran out, by the stage they ran out in",
            this.exceeded.clone(),
        );
        registry.register(
            "deadline_would_refuse",
            "What propagate would have refused, counted in observe mode, by stage and reason",
            this.would_refuse.clone(),
        );
        registry.register(
            "deadline_mode",
            "1 for the deadline mode in force now (legacy, observe, propagate), 0 for the others",
            this.mode.clone(),
        );
        // Every stage shows up from the first scrape, so dashboards and rate() queries
        // never see a series appear out of nowhere.
        for stage in Stage::ALL {
            let _ = this.exceeded.get_or_create(&this.stage_label(stage));
        }
        let _ = this.clamped.get_or_create(&ServiceLabel { service });
        this
    }

    fn stage_label(&self, stage: Stage) -> ServiceStage {
        ServiceStage {
            service: self.service,
            stage: stage.as_str(),
        }
    }

    /// Records an accepted budget and whether it was clamped.
    pub fn observe_inbound(&self, budget: Duration, clamped: bool) {
        let label = ServiceLabel {
            service: self.service,
        };
        self.inbound
            .get_or_create(&label)
            .observe(budget.as_secs_f64());
        if clamped {
            self.clamped.get_or_create(&label).inc();
        }
    }

    /// Records the budget left as `stage` starts.
    pub fn observe_remaining(&self, stage: Stage, remaining: Duration) {
        self.remaining
            .get_or_create(&self.stage_label(stage))
            .observe(remaining.as_secs_f64());
    }

    /// Counts a budget that ran out in `stage`.
    pub fn count_exceeded(&self, stage: Stage) {
        self.exceeded.get_or_create(&self.stage_label(stage)).inc();
    }

    /// Counts what propagate would have refused in `stage` (observe mode); `reason` is
    /// one of a fixed set (`deadline`, `predicted_late`, `queue_full`, ...).
    pub fn count_would_refuse(&self, stage: Stage, reason: &'static str) {
        let (service, stage) = (self.service, stage.as_str());
        let labels = StageReason {
            service,
            stage,
            reason,
        };
        self.would_refuse.get_or_create(&labels).inc();
    }

    /// Shows `current` as the mode in force: 1 for it, 0 for each of `all` others.
    pub fn set_mode(&self, current: &'static str, all: &[&'static str]) {
        for &mode in all {
            let labels = ServiceMode {
                service: self.service,
                mode,
            };
            self.mode
                .get_or_create(&labels)
                .set(i64::from(mode == current));
        }
    }
}

/// Why the bulkhead refused a call (`http_client_pool_rejections_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The pending queue was at its maximum.
    QueueFull,
    /// The wait for a slot passed the acquire timeout.
    AcquireTimeout,
    /// The request's own deadline ran out while waiting.
    Deadline,
}

impl RejectReason {
    fn as_str(self) -> &'static str {
        match self {
            RejectReason::QueueFull => "queue_full",
            RejectReason::AcquireTimeout => "acquire_timeout",
            RejectReason::Deadline => "deadline",
        }
    }
}

/// The pending and active gauges of one client; clones share the values. A bulkhead
/// moves them one step per transition, never `set`s them from counts read a moment
/// earlier: two releases at once would write the same stale count, stuck above 0.
#[derive(Clone, Debug, Default)]
pub struct PoolGauges {
    /// Calls waiting for a slot.
    pub pending: Gauge,
    /// Calls holding a slot.
    pub active: Gauge,
}

/// The outbound client families for one named client.
#[derive(Clone, Debug)]
pub struct ClientMetrics {
    requests: Family<ClientStatus, LatencyHistogram, fn() -> LatencyHistogram>,
    pending: Family<ClientLabel, Gauge>,
    active: Family<ClientLabel, Gauge>,
    acquire: Family<ClientLabel, Histogram, fn() -> Histogram>,
    rejections: Family<ClientReason, Counter>,
    retries: Family<ClientLabel, Counter>,
    admission: Family<ClientReason, Counter>,
    probes: Family<ClientLabel, Counter>,
    estimate: Family<ClientLabel, Gauge<f64, AtomicU64>>,
}

impl ClientMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            requests: Family::new_with_constructor(latency_histogram_with_exemplars),
            pending: Family::default(),
            active: Family::default(),
            acquire: Family::new_with_constructor(latency_histogram),
            rejections: Family::default(),
            retries: Family::default(),
            admission: Family::default(),
            probes: Family::default(),
            estimate: Family::default(),
        };
        registry.register(
            "http_client_requests_seconds",
            "Outbound call time (pool wait excluded) by status, or timeout/error",
            this.requests.clone(),
        );
        registry.register(
            "http_client_pool_pending_acquires",
            "Calls waiting for a connection slot",
            this.pending.clone(),
        );
        registry.register(
            "http_client_pool_active_connections",
            "Calls holding a connection slot",
            this.active.clone(),
        );
        registry.register(
            "http_client_pool_acquire_seconds",
            "Time spent waiting for a connection slot",
            this.acquire.clone(),
        );
        registry.register(
            "http_client_pool_rejections",
            "Calls refused by the pool, by reason",
            this.rejections.clone(),
        );
        registry.register(
            "http_client_retries",
            "Calls retried once after a refused connection (never after a 504)",
            this.retries.clone(),
        );
        registry.register(
            "http_client_admission_rejections",
            "Calls refused before taking a slot because they were predicted to finish late",
            this.admission.clone(),
        );
        registry.register(
            "http_client_admission_probes",
            "Calls predicted late but sent anyway, to learn whether the downstream recovered",
            this.probes.clone(),
        );
        registry.register(
            "http_client_latency_estimate_seconds",
            "The call time admission decides on (pool wait not included)",
            this.estimate.clone(),
        );
        this
    }

    /// Makes the series of `client` exist before its first call.
    pub fn init(&self, client: &'static str) {
        let label = ClientLabel { client };
        let _ = self.pending.get_or_create(&label);
        let _ = self.active.get_or_create(&label);
        let _ = self.acquire.get_or_create(&label);
        let _ = self.retries.get_or_create(&label);
        let _ = self.probes.get_or_create(&label);
        let _ = self.estimate.get_or_create(&label);
        let reason = "predicted_late";
        let _ = self
            .admission
            .get_or_create(&ClientReason { client, reason });
        for reason in [
            RejectReason::QueueFull,
            RejectReason::AcquireTimeout,
            RejectReason::Deadline,
        ] {
            let _ = self.rejections.get_or_create(&ClientReason {
                client,
                reason: reason.as_str(),
            });
        }
    }

    /// Records one call's time and its status (`"200"`, `"timeout"`, `"error"`).
    pub fn observe_request(&self, client: &'static str, status: &str, took: Duration) {
        let labels = ClientStatus {
            client,
            status: status.to_owned(),
        };
        observe_traced(&self.requests.get_or_create(&labels), took.as_secs_f64());
    }

    /// The pending and active gauges of `client`, for its bulkhead to move.
    pub fn pool_gauges(&self, client: &'static str) -> PoolGauges {
        let label = ClientLabel { client };
        PoolGauges {
            pending: self.pending.get_or_create(&label).clone(),
            active: self.active.get_or_create(&label).clone(),
        }
    }

    /// Records how long a call waited for its slot.
    pub fn observe_acquire(&self, client: &'static str, waited: Duration) {
        self.acquire
            .get_or_create(&ClientLabel { client })
            .observe(waited.as_secs_f64());
    }

    /// Counts a call refused as predicted late (`reason="predicted_late"`).
    pub fn count_predicted_late(&self, client: &'static str) {
        let reason = "predicted_late";
        self.admission
            .get_or_create(&ClientReason { client, reason })
            .inc();
    }

    /// Counts a probe: a call predicted late and sent anyway.
    pub fn count_probe(&self, client: &'static str) {
        self.probes.get_or_create(&ClientLabel { client }).inc();
    }

    /// The estimate gauge of `client`, for its admission to set.
    pub fn estimate_gauge(&self, client: &'static str) -> Gauge<f64, AtomicU64> {
        self.estimate.get_or_create(&ClientLabel { client }).clone()
    }

    /// Counts a retry after a refused connection.
    pub fn count_retry(&self, client: &'static str) {
        self.retries.get_or_create(&ClientLabel { client }).inc();
    }

    /// Counts a refused call.
    pub fn count_rejection(&self, client: &'static str, reason: RejectReason) {
        self.rejections
            .get_or_create(&ClientReason {
                client,
                reason: reason.as_str(),
            })
            .inc();
    }
}

/// `db_pool_connections{state}` and `db_pool_pending_acquires`.
#[derive(Clone, Debug)]
pub struct DbMetrics {
    connections: Family<StateLabel, Gauge>,
    pending: Gauge,
}

impl DbMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            connections: Family::default(),
            pending: Gauge::default(),
        };
        registry.register(
            "db_pool_connections",
            "Database pool connections by state",
            this.connections.clone(),
        );
        registry.register(
            "db_pool_pending_acquires",
            "Requests waiting for a database connection",
            this.pending.clone(),
        );
        this
    }

    /// Sets the idle and in-use counts.
    pub fn set_connections(&self, idle: usize, in_use: usize) {
        for (state, n) in [("idle", idle), ("in_use", in_use)] {
            self.connections
                .get_or_create(&StateLabel { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The pending-acquire gauge, moved by the acquire helper.
    pub fn pending(&self) -> &Gauge {
        &self.pending
    }
}
