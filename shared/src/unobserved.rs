//! The metric families when the `metrics` feature is off: the same names, keeping
//! nothing. The client and the database envelope hold an `Option` of their family,
//! always `None` without the feature, so their code reads the same either way and a
//! service that does not export metrics does not build prometheus-client.

#![cfg_attr(not(any(feature = "http-client", feature = "sqlx")), allow(dead_code))]

use std::time::Duration;

use crate::stage::Downstream;

/// A gauge that keeps nothing.
#[derive(Clone, Debug, Default)]
pub(crate) struct Gauge;

impl Gauge {
    pub(crate) fn inc(&self) {}
    pub(crate) fn dec(&self) {}
    pub(crate) fn set(&self, _value: f64) {}
}

/// What the latency estimate is written to.
pub(crate) type FloatGauge = Gauge;
/// What a pool's pending count is written to.
pub(crate) type IntGauge = Gauge;

/// The pending and active gauges of one client.
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolGauges {
    pub(crate) pending: Gauge,
    pub(crate) active: Gauge,
}

/// Why the bulkhead refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RejectReason {
    QueueFull,
    AcquireTimeout,
    Deadline,
}

/// Which attempt of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptKind {
    First,
    Hedge,
    Retry,
}

/// What became of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptOutcome {
    Won,
    Lost,
    Cut,
    RefusedBudget,
    RefusedDeadline,
    NoSlot,
}

/// No client families: there is no value of this type.
#[derive(Clone, Debug)]
pub(crate) enum ClientMetrics {}

impl ClientMetrics {
    pub(crate) fn init(&self, _: Downstream) {
        match *self {}
    }
    pub(crate) fn observe_request(&self, _: &'static str, _: &str, _: Duration) {
        match *self {}
    }
    pub(crate) fn pool_gauges(&self, _: &'static str) -> PoolGauges {
        match *self {}
    }
    pub(crate) fn observe_acquire(&self, _: &'static str, _: Duration) {
        match *self {}
    }
    pub(crate) fn count_predicted_late(&self, _: &'static str) {
        match *self {}
    }
    pub(crate) fn count_probe(&self, _: &'static str) {
        match *self {}
    }
    pub(crate) fn estimate_gauge(&self, _: &'static str) -> FloatGauge {
        match *self {}
    }
    pub(crate) fn wire_gauge(&self, _: &'static str) -> FloatGauge {
        match *self {}
    }
    pub(crate) fn hedge_delay_gauge(&self, _: &'static str) -> FloatGauge {
        match *self {}
    }
    pub(crate) fn count_attempt(&self, _: &'static str, _: AttemptKind, _: AttemptOutcome) {
        match *self {}
    }
    pub(crate) fn count_retry(&self, _: &'static str) {
        match *self {}
    }
    pub(crate) fn count_rejection(&self, _: &'static str, _: RejectReason) {
        match *self {}
    }
}

/// No database families: there is no value of this type.
#[derive(Clone, Debug)]
pub(crate) enum DbMetrics {}

impl DbMetrics {
    pub(crate) fn set_connections(&self, _: usize, _: usize) {
        match *self {}
    }
    pub(crate) fn pending(&self) -> &IntGauge {
        match *self {}
    }
}
