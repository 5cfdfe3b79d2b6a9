//! The outbound client's families: requests, the bulkhead's pool, retries, admission,
//! the wire and the attempts of each call, fed by [`ClientObserver`], a plugin of the
//! client, and read from the client and its plugins at each scrape. Every label value
//! comes from a fixed set.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::exemplar::{LatencyHistogram, latency_histogram_with_exemplars, observe_traced};
use super::{DeadlineMetrics, Histogram, latency_histogram};
use crate::client::{AttemptKind, AttemptOutcome, BudgetedClient, Event, Plugin};
use crate::downstream::Downstream;
use crate::metrics::names::{
    HTTP_CLIENT_ADMISSION_PROBES_TOTAL, HTTP_CLIENT_ADMISSION_REJECTIONS_TOTAL,
    HTTP_CLIENT_ATTEMPTS_TOTAL, HTTP_CLIENT_HEDGE_DELAY_SECONDS,
    HTTP_CLIENT_LATENCY_ESTIMATE_SECONDS, HTTP_CLIENT_POOL_ACQUIRE_SECONDS,
    HTTP_CLIENT_POOL_ACTIVE_CONNECTIONS, HTTP_CLIENT_POOL_PENDING_ACQUIRES,
    HTTP_CLIENT_POOL_REJECTIONS_TOTAL, HTTP_CLIENT_REQUESTS_SECONDS, HTTP_CLIENT_RETRIES_TOTAL,
    HTTP_CLIENT_WIRE_SECONDS, registered,
};

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
    /// here, with each rejection reason and `(kind, outcome)` pair of attempts, and its
    /// two `stage` series in the deadline families. Once per client, when it is built,
    /// so every label value comes from configuration.
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
        for &(kind, outcome) in &ATTEMPTS {
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
        for reason in ["queue_full", "acquire_timeout", "deadline"] {
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

    /// Records how long a call waited for its slot.
    fn observe_acquire(&self, client: &'static str, waited: Duration) {
        self.acquire
            .get_or_create(&ClientLabel { client })
            .observe(waited.as_secs_f64());
    }

    /// Counts a call refused as predicted late (`reason="predicted_late"`).
    fn count_predicted_late(&self, client: &'static str) {
        let reason = "predicted_late";
        self.admission
            .get_or_create(&ClientReason { client, reason })
            .inc();
    }

    /// Counts a probe: a call predicted late and sent anyway.
    fn count_probe(&self, client: &'static str) {
        self.probes.get_or_create(&ClientLabel { client }).inc();
    }

    /// Copies what `client` and its plugins hold now into the gauges (at each scrape).
    pub(crate) fn read(&self, client: &BudgetedClient) {
        let label = ClientLabel {
            client: client.downstream().name(),
        };
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.pending
            .get_or_create(&label)
            .set(count(client.pending()));
        self.active
            .get_or_create(&label)
            .set(count(client.active()));
        self.wire
            .get_or_create(&label)
            .set(client.wire().as_secs_f64());
        for (reading, value) in client.readings() {
            let family = match reading {
                "latency_estimate" => &self.estimate,
                "hedge_delay" => &self.hedge_delay,
                _ => continue,
            };
            family.get_or_create(&label).set(value.as_secs_f64());
        }
    }

    /// Counts one attempt of a call, or one that was not sent.
    fn count_attempt(&self, client: &'static str, kind: AttemptKind, outcome: AttemptOutcome) {
        let (kind, outcome) = (kind_label(kind), outcome_label(outcome));
        self.attempts
            .get_or_create(&ClientAttempt {
                client,
                kind,
                outcome,
            })
            .inc();
    }

    /// Counts a retry (a refused connection, a 503 of a request safe to send twice).
    fn count_retry(&self, client: &'static str) {
        self.retries.get_or_create(&ClientLabel { client }).inc();
    }

    /// Counts a call the bulkhead refused, for `reason`.
    fn count_rejection(&self, client: &'static str, reason: &'static str) {
        self.rejections
            .get_or_create(&ClientReason { client, reason })
            .inc();
    }
}

/// The plugin that counts and times a client's calls into its families.
#[derive(Debug)]
pub(crate) struct ClientObserver {
    pub(crate) client: &'static str,
    pub(crate) families: ClientMetrics,
}

impl Plugin for ClientObserver {
    fn on_event(&self, event: &Event) {
        let (families, client) = (&self.families, self.client);
        match *event {
            Event::SlotWait(waited) => families.observe_acquire(client, waited),
            Event::Refused(reason) => families.count_rejection(client, reason),
            Event::Probe => families.count_probe(client),
            Event::PredictedLate => families.count_predicted_late(client),
            Event::Attempt(attempt) => {
                let label = attempt.status.map(|s| s.as_str().to_owned());
                let label = label.as_deref().unwrap_or(attempt.failure);
                families.observe_request(client, label, attempt.took);
            }
            Event::Counted(kind, outcome) => families.count_attempt(client, kind, outcome),
            Event::Retry => families.count_retry(client),
            _ => {}
        }
    }
}

fn kind_label(kind: AttemptKind) -> &'static str {
    match kind {
        AttemptKind::First => "first",
        AttemptKind::Hedge => "hedge",
        AttemptKind::Retry => "retry",
    }
}

fn outcome_label(outcome: AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Won => "won",
        AttemptOutcome::Lost => "lost",
        AttemptOutcome::Cut => "cut",
        AttemptOutcome::RefusedBudget => "refused_budget",
        AttemptOutcome::RefusedDeadline => "refused_deadline",
        AttemptOutcome::NoSlot => "no_slot",
    }
}

/// Every `(kind, outcome)` an attempt can have (a first attempt is always sent, a retry
/// never loses): their series exist from the start.
const ATTEMPTS: [(&str, &str); 13] = [
    ("first", "won"),
    ("first", "lost"),
    ("first", "cut"),
    ("hedge", "won"),
    ("hedge", "lost"),
    ("hedge", "cut"),
    ("hedge", "refused_budget"),
    ("hedge", "refused_deadline"),
    ("hedge", "no_slot"),
    ("retry", "won"),
    ("retry", "cut"),
    ("retry", "refused_budget"),
    ("retry", "refused_deadline"),
];
