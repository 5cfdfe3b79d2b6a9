//! The configuration as metrics: `deadline_policy_seconds` and `http_client_pool_limit`
//! (docs/design.md §7).
//!
//! Why: a dashboard line or an alert threshold typed in by hand ("the budget is 2 s",
//! "the queue holds 50") is wrong as soon as someone changes a setting. Exported next to
//! the measurements, the limits are scraped from the process that enforces them, so
//! `pending / on (client) limit{kind="pending_max"}` stays true under any deployment.
//! Durations are in seconds, as every other time in the contract.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A gauge holding seconds (or a count) as a float.
type FloatGauge = Gauge<f64, AtomicU64>;

/// The empty label set of a family with a single series (prometheus-client's own
/// `NoLabelSet` is uninhabited, so no series could be created with it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceKind {
    service: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientKind {
    client: &'static str,
    kind: &'static str,
}

/// The limits of one pooled HTTP client, as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolLimits {
    /// Calls in flight at most.
    pub max_connections: usize,
    /// Calls waiting for a slot at most.
    pub pending_max: usize,
    /// The longest wait for a slot.
    pub acquire_timeout: Duration,
}

/// The configuration families of one service.
#[derive(Clone, Debug)]
pub(crate) struct SettingsMetrics {
    service: &'static str,
    policy: Family<ServiceKind, FloatGauge>,
    pool_limit: Family<ClientKind, FloatGauge>,
}

impl SettingsMetrics {
    pub(crate) fn register(registry: &mut Registry, service: &'static str) -> Self {
        let this = Self {
            service,
            policy: Family::default(),
            pool_limit: Family::default(),
        };
        registry.register(
            "deadline_policy_seconds",
            "The configured budget policy: max (clamp), default (no header), reserve (kept per hop)",
            this.policy.clone(),
        );
        registry.register(
            "http_client_pool_limit",
            "The configured limits of a pooled client: max_connections, pending_max, acquire_timeout_seconds",
            this.pool_limit.clone(),
        );
        this
    }

    /// Exports the budget policy; `reserve` only where the service calls downstream.
    pub(crate) fn set_deadline_policy(
        &self,
        max: Duration,
        default: Duration,
        reserve: Option<Duration>,
    ) {
        let kinds = [
            ("max", Some(max)),
            ("default", Some(default)),
            ("reserve", reserve),
        ];
        for (kind, value) in kinds {
            if let Some(value) = value {
                let labels = ServiceKind {
                    service: self.service,
                    kind,
                };
                self.policy.get_or_create(&labels).set(value.as_secs_f64());
            }
        }
    }

    /// Exports one kind of the policy (`reserve`, kept per hop by a client).
    pub(crate) fn set_policy_kind(&self, kind: &'static str, value: Duration) {
        let labels = ServiceKind {
            service: self.service,
            kind,
        };
        self.policy.get_or_create(&labels).set(value.as_secs_f64());
    }

    /// Exports the limits of the client named `client`.
    pub(crate) fn set_pool_limits(&self, client: &'static str, limits: PoolLimits) {
        let kinds = [
            ("max_connections", limits.max_connections as f64),
            ("pending_max", limits.pending_max as f64),
            (
                "acquire_timeout_seconds",
                limits.acquire_timeout.as_secs_f64(),
            ),
        ];
        for (kind, value) in kinds {
            self.pool_limit
                .get_or_create(&ClientKind { client, kind })
                .set(value);
        }
    }
}
