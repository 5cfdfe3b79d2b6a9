//! The outbound client's families: requests, the bulkhead's pool, retries and admission.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::exemplar::{LatencyHistogram, latency_histogram_with_exemplars, observe_traced};
use super::{DeadlineMetrics, latency_histogram};
use crate::stage::Downstream;

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

/// Why the bulkhead refused a call (`http_client_pool_rejections_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RejectReason {
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

/// Which attempt of a call (`http_client_attempts_total{kind}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptKind {
    /// The call's first attempt.
    First,
    /// A backup beside a slow first attempt.
    Hedge,
    /// A second attempt after a refused connection or a 503.
    Retry,
}

/// What became of an attempt (`http_client_attempts_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptOutcome {
    /// Sent; the call ended with its answer.
    Won,
    /// Sent; the call ended with another attempt's answer (this one was dropped or
    /// failed).
    Lost,
    /// Sent, and cut by the deadline (or answered 504: the downstream ran out of the
    /// budget it was given): its work was thrown away.
    Cut,
    /// Not sent: the retry budget had no token.
    RefusedBudget,
    /// Not sent: what was left could not cover an attempt's usual time.
    RefusedDeadline,
    /// Not sent (a hedge): no slot was free at once.
    NoSlot,
}

impl AttemptKind {
    const ALL: [Self; 3] = [Self::First, Self::Hedge, Self::Retry];

    fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Hedge => "hedge",
            Self::Retry => "retry",
        }
    }

    /// The outcomes an attempt of this kind can have (a first attempt is always sent).
    fn outcomes(self) -> &'static [AttemptOutcome] {
        use AttemptOutcome::*;
        match self {
            Self::First => &[Won, Lost, Cut],
            Self::Hedge => &[Won, Lost, Cut, RefusedBudget, RefusedDeadline, NoSlot],
            Self::Retry => &[Won, Cut, RefusedBudget, RefusedDeadline],
        }
    }
}

impl AttemptOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Won => "won",
            Self::Lost => "lost",
            Self::Cut => "cut",
            Self::RefusedBudget => "refused_budget",
            Self::RefusedDeadline => "refused_deadline",
            Self::NoSlot => "no_slot",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientAttempt {
    client: &'static str,
    kind: &'static str,
    outcome: &'static str,
}

/// The pending and active gauges of one client; clones share the values. A bulkhead
/// moves them one step per transition, never `set`s them from counts read a moment
/// earlier: two releases at once would write the same stale count, stuck above 0.
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolGauges {
    /// Calls waiting for a slot.
    pub pending: Gauge,
    /// Calls holding a slot.
    pub active: Gauge,
}

/// The outbound client families for one named client.
#[derive(Clone, Debug)]
pub(crate) struct ClientMetrics {
    requests: Family<ClientStatus, LatencyHistogram, fn() -> LatencyHistogram>,
    pending: Family<ClientLabel, Gauge>,
    active: Family<ClientLabel, Gauge>,
    acquire: Family<ClientLabel, Histogram, fn() -> Histogram>,
    rejections: Family<ClientReason, Counter>,
    retries: Family<ClientLabel, Counter>,
    admission: Family<ClientReason, Counter>,
    probes: Family<ClientLabel, Counter>,
    estimate: Family<ClientLabel, Gauge<f64, AtomicU64>>,
    wire: Family<ClientLabel, Gauge<f64, AtomicU64>>,
    attempts: Family<ClientAttempt, Counter>,
    hedge_delay: Family<ClientLabel, Gauge<f64, AtomicU64>>,
    /// The service's deadline families, for the stage series of each client.
    deadline: DeadlineMetrics,
}

impl ClientMetrics {
    pub(crate) fn register(registry: &mut Registry, deadline: DeadlineMetrics) -> Self {
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
            wire: Family::default(),
            attempts: Family::default(),
            hedge_delay: Family::default(),
            deadline,
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
        registry.register(
            "http_client_wire_seconds",
            "The round trip on the wire (call time less the downstream's own Server-Timing total), kept back from the budget sent",
            this.wire.clone(),
        );
        registry.register(
            "http_client_attempts",
            "Attempts of calls by kind (first, hedge, retry) and outcome (won, lost, cut by the deadline, or not sent: refused_budget, refused_deadline, no_slot)",
            this.attempts.clone(),
        );
        registry.register(
            "http_client_hedge_delay_seconds",
            "How long a first attempt runs before its hedge is sent (0: no hedge now)",
            this.hedge_delay.clone(),
        );
        this
    }

    /// Makes the series of `downstream` exist before its first call: its `client`
    /// series here and its two `stage` series in the deadline families. A client calls
    /// this once when it is built, so every label value comes from configuration.
    pub(crate) fn init(&self, downstream: Downstream) {
        self.deadline.init_downstream(downstream);
        let client = downstream.name();
        let label = ClientLabel { client };
        let _ = self.pending.get_or_create(&label);
        let _ = self.active.get_or_create(&label);
        let _ = self.acquire.get_or_create(&label);
        let _ = self.retries.get_or_create(&label);
        let _ = self.probes.get_or_create(&label);
        let _ = self.estimate.get_or_create(&label);
        let _ = self.wire.get_or_create(&label);
        let _ = self.hedge_delay.get_or_create(&label);
        for kind in AttemptKind::ALL {
            for outcome in kind.outcomes() {
                let _ = self.attempts.get_or_create(&ClientAttempt {
                    client,
                    kind: kind.as_str(),
                    outcome: outcome.as_str(),
                });
            }
        }
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
    pub(crate) fn observe_request(&self, client: &'static str, status: &str, took: Duration) {
        let labels = ClientStatus {
            client,
            status: status.to_owned(),
        };
        observe_traced(&self.requests.get_or_create(&labels), took.as_secs_f64());
    }

    /// The pending and active gauges of `client`, for its bulkhead to move.
    pub(crate) fn pool_gauges(&self, client: &'static str) -> PoolGauges {
        let label = ClientLabel { client };
        PoolGauges {
            pending: self.pending.get_or_create(&label).clone(),
            active: self.active.get_or_create(&label).clone(),
        }
    }

    /// Records how long a call waited for its slot.
    pub(crate) fn observe_acquire(&self, client: &'static str, waited: Duration) {
        self.acquire
            .get_or_create(&ClientLabel { client })
            .observe(waited.as_secs_f64());
    }

    /// Counts a call refused as predicted late (`reason="predicted_late"`).
    pub(crate) fn count_predicted_late(&self, client: &'static str) {
        let reason = "predicted_late";
        self.admission
            .get_or_create(&ClientReason { client, reason })
            .inc();
    }

    /// Counts a probe: a call predicted late and sent anyway.
    pub(crate) fn count_probe(&self, client: &'static str) {
        self.probes.get_or_create(&ClientLabel { client }).inc();
    }

    /// The estimate gauge of `client`, for its admission to set.
    pub(crate) fn estimate_gauge(&self, client: &'static str) -> Gauge<f64, AtomicU64> {
        self.estimate.get_or_create(&ClientLabel { client }).clone()
    }

    /// The wire gauge of `client`, for its wire estimate to set.
    pub(crate) fn wire_gauge(&self, client: &'static str) -> Gauge<f64, AtomicU64> {
        self.wire.get_or_create(&ClientLabel { client }).clone()
    }

    /// The hedge delay gauge of `client`, for its history to set.
    pub(crate) fn hedge_delay_gauge(&self, client: &'static str) -> Gauge<f64, AtomicU64> {
        self.hedge_delay
            .get_or_create(&ClientLabel { client })
            .clone()
    }

    /// Counts one attempt of a call, or one that was not sent.
    pub(crate) fn count_attempt(
        &self,
        client: &'static str,
        kind: AttemptKind,
        outcome: AttemptOutcome,
    ) {
        self.attempts
            .get_or_create(&ClientAttempt {
                client,
                kind: kind.as_str(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Counts a retry after a refused connection.
    pub(crate) fn count_retry(&self, client: &'static str) {
        self.retries.get_or_create(&ClientLabel { client }).inc();
    }

    /// Counts a refused call.
    pub(crate) fn count_rejection(&self, client: &'static str, reason: RejectReason) {
        self.rejections
            .get_or_create(&ClientReason {
                client,
                reason: reason.as_str(),
            })
            .inc();
    }
}
