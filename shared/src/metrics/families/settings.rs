//! The configuration as metrics: `deadline_policy_seconds` and `http_client_pool_limit`.
//!
//! Why: a dashboard line or an alert threshold typed in by hand ("the budget is 2 s",
//! "the queue holds 50") is wrong as soon as someone changes a setting. Exported next to
//! the measurements, the limits are scraped from the process that enforces them, so
//! `pending / on (client) limit{kind="pending_max"}` stays true under any deployment.
//! Durations are in seconds, as every other time in the contract.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::metrics::FloatGauge;
use crate::metrics::names::{DEADLINE_POLICY_SECONDS, HTTP_CLIENT_POOL_LIMIT};

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
#[cfg(feature = "http-client")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolLimits {
    /// Calls in flight at most.
    pub(crate) max_connections: u32,
    /// Calls waiting for a slot at most.
    pub(crate) pending_max: u32,
    /// The longest wait for a slot.
    pub(crate) acquire_timeout: Duration,
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
            DEADLINE_POLICY_SECONDS,
            "The configured budget policy: max (clamp), default (no header), reserve (kept per hop)",
            this.policy.clone(),
        );
        registry.register(
            HTTP_CLIENT_POOL_LIMIT,
            "The configured limits of a pooled client: max_connections, pending_max, acquire_timeout_seconds",
            this.pool_limit.clone(),
        );
        this
    }

    /// Exports the ingress's budget policy.
    pub(crate) fn set_deadline_policy(&self, max: Duration, default: Duration) {
        self.set_policy_kind("max", max);
        self.set_policy_kind("default", default);
    }

    /// Exports one kind of the policy: `max` and `default` (the ingress), `reserve`
    /// (kept per hop by a client, so only where the service calls downstream).
    pub(crate) fn set_policy_kind(&self, kind: &'static str, value: Duration) {
        let labels = ServiceKind {
            service: self.service,
            kind,
        };
        self.policy.get_or_create(&labels).set(value.as_secs_f64());
    }

    /// Exports the limits of the client named `client`.
    #[cfg(feature = "http-client")]
    pub(crate) fn set_pool_limits(&self, client: &'static str, limits: PoolLimits) {
        let kinds = [
            ("max_connections", f64::from(limits.max_connections)),
            ("pending_max", f64::from(limits.pending_max)),
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
