//! The metric families, each registered under its contract name (docs/design.md §7).
//!
//! prometheus-client appends `_total` to counters, so counters are registered without it.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::stage::{Downstream, Stage};

// One file per group of families: what a client, the database pool, tool calls and
// the configuration report, and the trace exemplars of the latency histograms.
mod client;
mod db;
mod exemplar;
mod settings;
mod tools;

pub(crate) use client::{AttemptKind, AttemptOutcome, ClientMetrics, PoolGauges, RejectReason};
pub(crate) use db::DbMetrics;
#[cfg(feature = "axum")]
use exemplar::observe_traced;
use exemplar::{LatencyHistogram, latency_histogram_with_exemplars};
pub(crate) use settings::{PoolLimits, SettingsMetrics};
pub(crate) use tools::ToolMetrics;

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

/// What observe mode can count as "propagate would have refused" outside a downstream.
const WOULD_REFUSE: [(Stage, &str); 5] = [
    (Stage::Ingress, "deadline"),
    (Stage::Ingress, "invalid_header"),
    (Stage::DbPool, "acquire_timeout"),
    (Stage::DbPool, "deadline"),
    (Stage::Db, "deadline"),
];

/// What observe mode can count for one downstream's stages (its client's refusals).
fn would_refuse_in(downstream: Downstream) -> [(Stage, &'static str); 5] {
    let (call, pool) = (downstream.call(), downstream.pool());
    [
        (call, "predicted_late"),
        (call, "deadline"),
        (pool, "queue_full"),
        (pool, "acquire_timeout"),
        (pool, "deadline"),
    ]
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

/// `http_server_requests_seconds` and `http_server_requests_in_flight`.
///
/// Request times carry the sampled `trace_id` as an exemplar (families/exemplar.rs).
#[derive(Clone, Debug)]
pub(crate) struct HttpServerMetrics {
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
    #[cfg(feature = "axum")]
    pub(crate) fn observe_request(&self, labels: &RequestLabels, seconds: f64) {
        observe_traced(&self.requests.get_or_create(labels), seconds);
    }
}

/// The deadline families, labelled with the owning service.
#[derive(Clone, Debug)]
pub(crate) struct DeadlineMetrics {
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
        // never see a series appear out of nowhere. A downstream's appear when it is
        // declared (`init_downstream`), which building its client does.
        this.init_would_refuse(WOULD_REFUSE);
        for stage in Stage::ALL {
            let _ = this.exceeded.get_or_create(&this.stage_label(stage));
        }
        let _ = this.clamped.get_or_create(&ServiceLabel { service });
        this
    }

    /// Makes the series of `downstream`'s two stages exist at 0: called when its client
    /// is built, at start-up, so the label set is bounded by the configuration.
    pub(crate) fn init_downstream(&self, downstream: Downstream) {
        self.init_would_refuse(would_refuse_in(downstream));
        for stage in downstream.stages() {
            let _ = self.exceeded.get_or_create(&self.stage_label(stage));
        }
    }

    fn init_would_refuse(&self, pairs: impl IntoIterator<Item = (Stage, &'static str)>) {
        for (stage, reason) in pairs {
            let labels = StageReason {
                service: self.service,
                stage: stage.as_str(),
                reason,
            };
            let _ = self.would_refuse.get_or_create(&labels);
        }
    }

    fn stage_label(&self, stage: Stage) -> ServiceStage {
        ServiceStage {
            service: self.service,
            stage: stage.as_str(),
        }
    }

    /// Records an accepted budget and whether it was clamped.
    pub(crate) fn observe_inbound(&self, budget: Duration, clamped: bool) {
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
    pub(crate) fn observe_remaining(&self, stage: Stage, remaining: Duration) {
        self.remaining
            .get_or_create(&self.stage_label(stage))
            .observe(remaining.as_secs_f64());
    }

    /// Counts a budget that ran out in `stage`.
    pub(crate) fn count_exceeded(&self, stage: Stage) {
        self.exceeded.get_or_create(&self.stage_label(stage)).inc();
    }

    /// Counts what propagate would have refused in `stage` (observe mode); `reason` is
    /// one of a fixed set (`deadline`, `predicted_late`, `queue_full`, ...).
    pub(crate) fn count_would_refuse(&self, stage: Stage, reason: &'static str) {
        let (service, stage) = (self.service, stage.as_str());
        let labels = StageReason {
            service,
            stage,
            reason,
        };
        self.would_refuse.get_or_create(&labels).inc();
    }

    /// Shows `current` as the mode in force: 1 for it, 0 for each of `all` others.
    pub(crate) fn set_mode(&self, current: &'static str, all: &[&'static str]) {
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
