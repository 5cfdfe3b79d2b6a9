//! The deadline families: budgets accepted and clamped, left at each stage, run out,
//! answers past the deadline, and what observe mode would have refused.
//! [`DeadlineMetrics`] is what the core reports to ([`Report`]).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Histogram, latency_histogram};
#[cfg(any(feature = "http-client", feature = "grpc"))]
use crate::downstream::Downstream;
use crate::metrics::names::{
    DEADLINE_CLAMPED_TOTAL, DEADLINE_EXCEEDED_TOTAL, DEADLINE_INBOUND_BUDGET_SECONDS,
    DEADLINE_OVERRUN_SECONDS, DEADLINE_REMAINING_SECONDS, DEADLINE_WOULD_REFUSE_TOTAL, registered,
};
use crate::stage::Stage;
use crate::timing::Report;

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
#[cfg(any(feature = "http-client", feature = "grpc"))]
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

/// The deadline families, labelled with the owning service.
#[derive(Clone, Debug)]
pub(crate) struct DeadlineMetrics {
    service: &'static str,
    /// The service's one series of `deadline_inbound_budget_seconds` and of
    /// `deadline_clamped_total`, held so that a request does not look them up in their
    /// family (SipHash of the label set under a lock); the families themselves are
    /// only the registry's. Only the ingress observes them.
    inbound_series: Histogram,
    clamped_series: Counter,
    /// The service's one series of `deadline_overrun_seconds`, observed by every answer.
    overrun_series: Histogram,
    remaining: Family<ServiceStage, Histogram, fn() -> Histogram>,
    /// `remaining`'s series by stage, found without hashing their labels: a request
    /// observes one at each stage it starts, and the family's lookup (SipHash of the
    /// label set under its lock) cost more than the observation. A handful of stages,
    /// so a scan; written once per stage, on its first observation.
    remaining_at: Arc<RwLock<Vec<(Stage, Histogram)>>>,
    exceeded: Family<ServiceStage, Counter>,
    would_refuse: Family<StageReason, Counter>,
}

impl DeadlineMetrics {
    pub(crate) fn register(registry: &mut Registry, service: &'static str) -> Self {
        let inbound: Family<ServiceLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let clamped: Family<ServiceLabel, Counter> = Family::default();
        let overrun: Family<ServiceLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let label = ServiceLabel { service };
        let this = Self {
            service,
            inbound_series: inbound.get_or_create_owned(&label),
            clamped_series: clamped.get_or_create_owned(&label),
            overrun_series: overrun.get_or_create_owned(&label),
            remaining: Family::new_with_constructor(latency_histogram),
            remaining_at: Arc::default(),
            exceeded: Family::default(),
            would_refuse: Family::default(),
        };
        registry.register(
            DEADLINE_INBOUND_BUDGET_SECONDS,
            "Budget accepted at the ingress, after clamping",
            inbound,
        );
        registry.register(
            registered(DEADLINE_CLAMPED_TOTAL),
            "Requests whose asked-for budget was clamped to [1 ms, max]",
            clamped.clone(),
        );
        registry.register(
            DEADLINE_OVERRUN_SECONDS,
            "How late past its deadline the service answered (0: in time)",
            overrun,
        );
        registry.register(
            DEADLINE_REMAINING_SECONDS,
            "Budget left when a stage starts",
            this.remaining.clone(),
        );
        registry.register(
            registered(DEADLINE_EXCEEDED_TOTAL),
            "Budgets that ran out, by the stage they ran out in",
            this.exceeded.clone(),
        );
        registry.register(
            registered(DEADLINE_WOULD_REFUSE_TOTAL),
            "What propagate would have refused, counted in observe mode, by stage and reason",
            this.would_refuse.clone(),
        );
        // Every stage shows up from the first scrape, so dashboards and rate() queries
        // never see a series appear out of nowhere. A downstream's appear when it is
        // declared (`init_downstream`), which building its client does.
        this.init_would_refuse(WOULD_REFUSE);
        for stage in Stage::ALL {
            let _ = this.exceeded.get_or_create(&this.stage_label(stage));
        }
        let _ = clamped.get_or_create(&label);
        this
    }

    /// Makes the series of `downstream`'s two stages exist at 0: called when its client
    /// is built, at start-up, so the label set is bounded by the configuration.
    #[cfg(any(feature = "http-client", feature = "grpc"))]
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
}

/// What the core reports goes to the deadline families.
impl Report for DeadlineMetrics {
    fn inbound(&self, budget: Duration, clamped: bool) {
        self.inbound_series.observe(budget.as_secs_f64());
        if clamped {
            self.clamped_series.inc();
        }
    }

    fn stage_started(&self, stage: Stage, remaining: Duration) {
        let seconds = remaining.as_secs_f64();
        {
            let known = self
                .remaining_at
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some((_, series)) = known.iter().find(|(known, _)| *known == stage) {
                series.observe(seconds);
                return;
            }
        }
        let series = self.remaining.get_or_create_owned(&self.stage_label(stage));
        series.observe(seconds);
        let mut known = self
            .remaining_at
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if !known.iter().any(|(known, _)| *known == stage) {
            known.push((stage, series));
        }
    }

    fn answered(&self, overrun: Duration) {
        self.overrun_series.observe(overrun.as_secs_f64());
    }

    fn exceeded(&self, stage: Stage) {
        self.exceeded.get_or_create(&self.stage_label(stage)).inc();
    }

    /// `reason` is one of a fixed set (`deadline`, `predicted_late`, `queue_full`, ...).
    fn would_refuse(&self, stage: Stage, reason: &'static str) {
        let (service, stage) = (self.service, stage.as_str());
        let labels = StageReason {
            service,
            stage,
            reason,
        };
        self.would_refuse.get_or_create(&labels).inc();
    }
}
