//! The metrics' stand-in where the `metrics` feature is off: the same names, keeping
//! nothing. The client, the database envelope and tool budgets hold an `Option` of their
//! family, always `None` here, so their code reads the same either way, and a service
//! that exports no metrics does not build prometheus-client. This is the one way the
//! feature is switched off: no code outside this file asks whether it is on (only the
//! public `with_metrics` methods exist with it alone).

/// A gauge that keeps nothing.
#[cfg(any(feature = "http-client", feature = "sqlx"))]
#[derive(Clone, Debug, Default)]
pub(crate) struct Gauge;

#[cfg(any(feature = "http-client", feature = "sqlx"))]
impl Gauge {
    #[cfg(any(feature = "http-client", feature = "sqlx"))]
    pub(crate) fn inc(&self) {}
    #[cfg(any(feature = "http-client", feature = "sqlx"))]
    pub(crate) fn dec(&self) {}
    #[cfg(feature = "http-client")]
    pub(crate) fn set(&self, _value: f64) {}
}

/// What the latency estimate and the wire are written to.
#[cfg(feature = "http-client")]
pub(crate) type FloatGauge = Gauge;
/// What a pool's pending count is written to.
#[cfg(feature = "sqlx")]
pub(crate) type IntGauge = Gauge;

/// The pending and active gauges of one client.
#[cfg(feature = "http-client")]
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolGauges {
    pub(crate) pending: Gauge,
    pub(crate) active: Gauge,
}

/// No client families: there is no value of this type.
#[cfg(feature = "http-client")]
#[derive(Clone, Debug)]
pub(crate) enum ClientMetrics {}

#[cfg(feature = "http-client")]
impl ClientMetrics {
    pub(crate) fn init(
        &self,
        _: crate::Downstream,
        _: &[&'static str],
        _: &[(&'static str, &'static str)],
    ) {
        match *self {}
    }
    pub(crate) fn pool_gauges(&self, _: &'static str) -> PoolGauges {
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
    pub(crate) fn observe_request(&self, _: &'static str, _: &str, _: std::time::Duration) {
        match *self {}
    }
    pub(crate) fn observe_acquire(&self, _: &'static str, _: std::time::Duration) {
        match *self {}
    }
    pub(crate) fn count_predicted_late(&self, _: &'static str) {
        match *self {}
    }
    pub(crate) fn count_probe(&self, _: &'static str) {
        match *self {}
    }
    pub(crate) fn count_retry(&self, _: &'static str) {
        match *self {}
    }
    pub(crate) fn count_rejection(&self, _: &'static str, _: &'static str) {
        match *self {}
    }
    pub(crate) fn count_attempt(&self, _: &'static str, _: &'static str, _: &'static str) {
        match *self {}
    }
}

/// No database families: there is no value of this type.
#[cfg(feature = "sqlx")]
#[derive(Clone, Debug)]
pub(crate) enum DbMetrics {}

#[cfg(feature = "sqlx")]
impl DbMetrics {
    pub(crate) fn pending(&self) -> &IntGauge {
        match *self {}
    }
}

/// No tool families: there is no value of this type.
#[derive(Clone, Debug)]
pub(crate) enum ToolMetrics {}

impl ToolMetrics {
    pub(crate) fn count(&self, _: &str, _: &'static str) {
        match *self {}
    }
}
