//! [`DeadlineMode`] and [`LiveMode`]: how budgets are treated, switchable at run time.
//!
//! Rolling the technique out is itself a risk: a budget that is too tight, or an
//! admission that refuses too eagerly, turns into errors for real users the moment it is
//! switched on. So there is a middle step, `observe` (Finagle's "dark mode"): everything
//! runs (budgets, headers, metrics, the latency estimate) but nothing is refused, and
//! `deadline_would_refuse_total{stage,reason}` counts what propagate would have refused.
//! When that count looks right, switch to `propagate`; if something goes wrong, switch
//! back. [`LiveMode`] makes that a run-time switch (orders-service's admin API) rather
//! than a restart.
//!
//! The ingress reads the mode once per request and stamps it on the request's
//! [`Deadline`](crate::Deadline); the client and the database read it from there. So a
//! switch applies to the next request, and a request in flight never runs half in one
//! mode and half in another.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::timing::Reporter;

/// How an ingress treats budgets.
///
/// ```
/// use deadline_propagation::DeadlineMode;
///
/// // As settings, the admin API and the metric label spell it.
/// let mode: DeadlineMode = serde_json::from_str("\"observe\"").unwrap();
/// assert_eq!(mode.as_str(), "observe");
/// assert!(!mode.enforces());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum DeadlineMode {
    /// Accept the client's budget (clamped), propagate it, answer 504 when it runs out.
    #[default]
    Propagate,
    /// Run the budget, headers, metrics and latency estimate, but refuse nothing: count
    /// what propagate would have refused. Waits and timeouts are legacy's.
    Observe,
    /// The off switch: no budget is enforced, and each call and transaction waits at
    /// most the fixed timeout you set ([`DeadlinePolicy::legacy_timeout`](crate::DeadlinePolicy::legacy_timeout)),
    /// with no server-side statement limit: how the service behaves without the
    /// technique, for an operator who must turn it off at once (and for a before/after
    /// measurement).
    Legacy,
}

impl DeadlineMode {
    /// Every mode, for the `deadline_mode` gauge.
    pub const ALL: [DeadlineMode; 3] = [
        DeadlineMode::Legacy,
        DeadlineMode::Observe,
        DeadlineMode::Propagate,
    ];

    /// The name used in settings, the admin API and the metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeadlineMode::Propagate => "propagate",
            DeadlineMode::Observe => "observe",
            DeadlineMode::Legacy => "legacy",
        }
    }

    /// Whether this mode refuses work (504, 503) where the budget says so.
    pub const fn enforces(self) -> bool {
        matches!(self, DeadlineMode::Propagate)
    }

    const fn to_u8(self) -> u8 {
        match self {
            DeadlineMode::Propagate => 0,
            DeadlineMode::Observe => 1,
            DeadlineMode::Legacy => 2,
        }
    }

    const fn from_u8(value: u8) -> Self {
        match value {
            1 => DeadlineMode::Observe,
            2 => DeadlineMode::Legacy,
            _ => DeadlineMode::Propagate,
        }
    }
}

/// The mode in force now; clones share it. One atomic load per request.
///
/// ```
/// use deadline_propagation::{DeadlineMode, LiveMode};
///
/// let mode = LiveMode::new(DeadlineMode::Legacy);
/// let seen_by_the_layer = mode.clone();
/// assert_eq!(mode.set(DeadlineMode::Propagate), DeadlineMode::Legacy);
/// assert_eq!(seen_by_the_layer.get(), DeadlineMode::Propagate);
/// ```
#[derive(Clone, Debug)]
pub struct LiveMode {
    current: Arc<AtomicU8>,
    /// Held while switching: the swap and its report happen as one step, so two
    /// switches at once cannot leave the metrics showing the mode that lost.
    switching: Arc<Mutex<()>>,
    report: Reporter,
}

impl LiveMode {
    /// Starts in `mode`.
    pub fn new(mode: DeadlineMode) -> Self {
        Self {
            current: Arc::new(AtomicU8::new(mode.to_u8())),
            switching: Arc::default(),
            report: None,
        }
    }

    /// The same switch, reporting the mode in force to `report` from now on (the
    /// metrics attach themselves this way).
    pub(crate) fn reporting(mut self, report: Reporter) -> Self {
        self.report = report;
        self.show(self.get());
        self
    }

    /// The mode in force.
    pub fn get(&self) -> DeadlineMode {
        DeadlineMode::from_u8(self.current.load(Ordering::Relaxed))
    }

    /// Switches to `mode` for every request that starts from now on; returns the mode
    /// it replaced.
    pub fn set(&self, mode: DeadlineMode) -> DeadlineMode {
        // Requests read the mode without the lock; only switches take it.
        let _switching = self
            .switching
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = DeadlineMode::from_u8(self.current.swap(mode.to_u8(), Ordering::Relaxed));
        self.show(mode);
        before
    }

    fn show(&self, mode: DeadlineMode) {
        if let Some(report) = &self.report {
            report.mode(mode);
        }
    }
}

impl From<DeadlineMode> for LiveMode {
    fn from(mode: DeadlineMode) -> Self {
        Self::new(mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_seen_by_every_clone() {
        let mode = LiveMode::new(DeadlineMode::Legacy);
        let seen_by_ingress = mode.clone();
        for next in DeadlineMode::ALL {
            mode.set(next);
            assert_eq!(seen_by_ingress.get(), next);
        }
    }

    #[test]
    fn modes_read_and_write_as_lowercase_names() {
        for mode in DeadlineMode::ALL {
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{}\"", mode.as_str()));
            assert_eq!(serde_json::from_str::<DeadlineMode>(&json).unwrap(), mode);
        }
    }
}
