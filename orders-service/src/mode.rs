//! [`Mode`]: how orders-service treats budgets, switched at run time (`PUT /admin/mode`).
//!
//! `observe` and `propagate` are the crate's modes ([`DeadlineMode`]): the deadline
//! layer reads them from the [`LiveMode`] here. `legacy` is this service without the
//! technique, for the before/after experiment: its requests go round the deadline
//! layer, and each step takes the plain path a service without the technique has
//! (`legacy.rs`). A switch and the `deadline_mode` gauge change in one step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use deadline_propagation::{DeadlineMode, LiveMode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use service_kit::metrics::names::DEADLINE_MODE;

pub use crate::config::Mode;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    service: &'static str,
    mode: &'static str,
}

/// The mode in force; clones share it.
#[derive(Clone, Debug)]
pub struct ModeSwitch {
    legacy: Arc<AtomicBool>,
    /// The deadline layer's mode while not legacy.
    live: LiveMode,
    /// Held while switching: the mode and its gauge change as one step, so two switches
    /// at once cannot leave the gauge showing the one that lost.
    switching: Arc<Mutex<()>>,
    gauge: Family<ModeLabels, Gauge>,
    service: &'static str,
}

impl ModeSwitch {
    /// Starts in `mode`, showing it as `deadline_mode{service, mode}` in `registry`.
    pub fn new(mode: Mode, service: &'static str, registry: &mut Registry) -> Self {
        let gauge = Family::<ModeLabels, Gauge>::default();
        registry.register(
            DEADLINE_MODE,
            "1 for the deadline mode in force now (legacy, observe, propagate), 0 for the others",
            gauge.clone(),
        );
        let switch = Self {
            legacy: Arc::new(AtomicBool::new(false)),
            live: LiveMode::new(DeadlineMode::Propagate),
            switching: Arc::default(),
            gauge,
            service,
        };
        switch.set(mode);
        switch
    }

    /// The mode in force.
    pub fn get(&self) -> Mode {
        if self.is_legacy() {
            return Mode::Legacy;
        }
        match self.live.get() {
            DeadlineMode::Observe => Mode::Observe,
            DeadlineMode::Propagate => Mode::Propagate,
        }
    }

    /// Whether requests starting now take the path without the technique.
    pub fn is_legacy(&self) -> bool {
        self.legacy.load(Ordering::Acquire)
    }

    /// What the deadline layer reads.
    pub fn live(&self) -> LiveMode {
        self.live.clone()
    }

    /// Switches for every request that starts from now on; returns the mode replaced.
    pub fn set(&self, mode: Mode) -> Mode {
        let _switching = self
            .switching
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = self.get();
        match mode {
            Mode::Legacy => self.legacy.store(true, Ordering::Release),
            Mode::Observe | Mode::Propagate => {
                let live = match mode {
                    Mode::Observe => DeadlineMode::Observe,
                    _ => DeadlineMode::Propagate,
                };
                self.live.set(live);
                self.legacy.store(false, Ordering::Release);
            }
        }
        for shown in Mode::ALL {
            let labels = ModeLabels {
                service: self.service,
                mode: shown.as_str(),
            };
            self.gauge
                .get_or_create(&labels)
                .set(i64::from(shown == mode));
        }
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two admins switching at once must leave one mode in force and the gauge showing
    /// that one, and only it, at 1.
    #[test]
    fn concurrent_switches_leave_the_gauge_showing_the_mode_in_force() {
        let mut registry = Registry::default();
        let switch = ModeSwitch::new(Mode::Propagate, "orders", &mut registry);
        let shown = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            Mode::ALL.map(|m| {
                text.contains(&format!(
                    "deadline_mode{{service=\"orders\",mode=\"{}\"}} 1",
                    m.as_str()
                ))
            })
        };
        for round in 0..2000 {
            let start = std::sync::Barrier::new(Mode::ALL.len());
            std::thread::scope(|scope| {
                for next in Mode::ALL {
                    let (switch, start) = (&switch, &start);
                    scope.spawn(move || {
                        start.wait();
                        switch.set(next);
                    });
                }
            });
            let expected = Mode::ALL.map(|m| m == switch.get());
            assert_eq!(
                shown(),
                expected,
                "round {round}: {:?} in force",
                switch.get()
            );
        }
    }
}
