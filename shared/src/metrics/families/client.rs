//! The outbound client's families: requests, the bulkhead's pool, retries, admission,
//! the wire and the attempts of each call. Every label value is given by the client, as
//! a plain `&'static str` from a fixed set.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::exemplar::{LatencyHistogram, latency_histogram_with_exemplars, observe_traced};
use super::{DeadlineMetrics, Histogram, latency_histogram};
use crate::metrics::names::{
    HTTP_CLIENT_ADMISSION_PROBES_TOTAL, HTTP_CLIENT_ADMISSION_REJECTIONS_TOTAL,
    HTTP_CLIENT_ATTEMPTS_TOTAL, HTTP_CLIENT_HEDGE_DELAY_SECONDS,
    HTTP_CLIENT_LATENCY_ESTIMATE_SECONDS, HTTP_CLIENT_POOL_ACQUIRE_SECONDS,
    HTTP_CLIENT_POOL_ACTIVE_CONNECTIONS, HTTP_CLIENT_POOL_PENDING_ACQUIRES,
    HTTP_CLIENT_POOL_REJECTIONS_TOTAL, HTTP_CLIENT_REQUESTS_SECONDS, HTTP_CLIENT_RETRIES_TOTAL,
    HTTP_CLIENT_WIRE_SECONDS, registered,
};
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
            HTTP_CLIENT_REQUESTS_SECONDS,
            "Outbound call time (pool wait excluded) by status, or timeout/error",
            this.requests.clone(),
        );
        registry.register(
            HTTP_CLIENT_POOL_PENDING_ACQUIRES,
            "Calls waiting for a connection slot",
            this.pending.clone(),
        );
        registry.register(
            HTTP_CLIENT_POOL_ACTIVE_CONNECTIONS,
            "Calls holding a connection slot",
            this.active.clone(),
        );
        registry.register(
            HTTP_CLIENT_POOL_ACQUIRE_SECONDS,
            "Time spent waiting for a connection slot",
            this.acquire.clone(),
        );
        registry.register(
            registered(HTTP_CLIENT_POOL_REJECTIONS_TOTAL),
            "Calls refused by the pool, by reason",
            this.rejections.clone(),
        );
        registry.register(
            registered(HTTP_CLIENT_RETRIES_TOTAL),
            "Calls retried once after a refused connection (never after a 504)",
            this.retries.clone(),
        );
        registry.register(
            registered(HTTP_CLIENT_ADMISSION_REJECTIONS_TOTAL),
            "Calls refused before taking a slot because they were predicted to finish late",
            this.admission.clone(),
        );
        registry.register(
            registered(HTTP_CLIENT_ADMISSION_PROBES_TOTAL),
            "Calls predicted late but sent anyway, to learn whether the downstream recovered",
            this.probes.clone(),
        );
        registry.register(
            HTTP_CLIENT_LATENCY_ESTIMATE_SECONDS,
            "The call time admission decides on (pool wait not included)",
            this.estimate.clone(),
        );
        registry.register(
            HTTP_CLIENT_WIRE_SECONDS,
            "The round trip on the wire (call time less the downstream's own Server-Timing total), kept back from the budget sent",
            this.wire.clone(),
        );
        registry.register(
            registered(HTTP_CLIENT_ATTEMPTS_TOTAL),
            "Attempts of calls by kind (first, hedge, retry) and outcome (won, lost, cut by the deadline, or not sent: refused_budget, refused_deadline, no_slot)",
            this.attempts.clone(),
        );
        registry.register(
            HTTP_CLIENT_HEDGE_DELAY_SECONDS,
            "How long a first attempt runs before its hedge is sent (0: no hedge now)",
            this.hedge_delay.clone(),
        );
        this
    }

    /// Makes the series of `downstream` exist before its first call: its `client` series
    /// here, with each of the client's rejection `reasons` and `(kind, outcome)` pairs
    /// of attempts, and its two `stage` series in the deadline families. A client calls
    /// this once when it is built, so every label value comes from configuration.
    pub(crate) fn init(
        &self,
        downstream: Downstream,
        reasons: &[&'static str],
        attempts: &[(&'static str, &'static str)],
    ) {
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
        for &(kind, outcome) in attempts {
            let _ = self.attempts.get_or_create(&ClientAttempt {
                client,
                kind,
                outcome,
            });
        }
        let reason = "predicted_late";
        let _ = self
            .admission
            .get_or_create(&ClientReason { client, reason });
        for &reason in reasons {
            let _ = self
                .rejections
                .get_or_create(&ClientReason { client, reason });
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
        kind: &'static str,
        outcome: &'static str,
    ) {
        self.attempts
            .get_or_create(&ClientAttempt {
                client,
                kind,
                outcome,
            })
            .inc();
    }

    /// Counts a retry (a refused connection, a 503 of a request safe to send twice).
    pub(crate) fn count_retry(&self, client: &'static str) {
        self.retries.get_or_create(&ClientLabel { client }).inc();
    }

    /// Counts a call the bulkhead refused, for `reason`.
    pub(crate) fn count_rejection(&self, client: &'static str, reason: &'static str) {
        self.rejections
            .get_or_create(&ClientReason { client, reason })
            .inc();
    }
}
