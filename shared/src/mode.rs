//! [`DeadlineMode`]: propagate, or observe; [`LiveMode`]: the mode in force, switched at
//! run time; and the marker that carries observe mode downstream.
//!
//! Switching the technique on is itself a risk: a budget too tight turns into errors
//! for real users at once. So there is a middle step, `observe` (Finagle's "dark
//! mode"): everything runs, nothing is refused, and `deadline_would_refuse_total`
//! counts what propagate would have refused. The ingress stamps the mode on each
//! request's [`Deadline`](crate::Deadline), so no request runs half in one mode.
//!
//! A budget sent downstream would still be enforced there, so an observed call carries
//! `X-Deadline-Mode: observe`, and a downstream that honours it
//! ([`DeadlineLayer::honour_mode_header`](crate::DeadlineLayer::honour_mode_header))
//! observes too. Only services that other services call should honour it: at the edge,
//! any client could switch the protection off for its own requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderName};

/// How an ingress treats budgets; serialized as `"propagate"` or `"observe"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadlineMode {
    /// Accept the client's budget (clamped), propagate it, answer 504 when it runs out.
    #[default]
    Propagate,
    /// Run everything but refuse nothing: count what propagate would have refused. Each
    /// step waits as it would without the technique (a fixed timeout, no statement
    /// limit).
    Observe,
}

impl DeadlineMode {
    /// Every mode.
    pub const ALL: [DeadlineMode; 2] = [DeadlineMode::Observe, DeadlineMode::Propagate];

    /// The name used in settings, the admin API and the metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeadlineMode::Propagate => "propagate",
            DeadlineMode::Observe => "observe",
        }
    }

    /// Whether this mode refuses work (504, 503) where the budget says so.
    pub const fn enforces(self) -> bool {
        matches!(self, DeadlineMode::Propagate)
    }
}

/// The mode in force now; clones share it. One atomic load per request.
#[derive(Clone, Debug, Default)]
pub struct LiveMode {
    observe: Arc<AtomicBool>,
}

impl LiveMode {
    /// Starts in `mode`.
    pub fn new(mode: DeadlineMode) -> Self {
        let live = Self::default();
        live.set(mode);
        live
    }

    /// The mode in force.
    pub fn get(&self) -> DeadlineMode {
        match self.observe.load(Ordering::Relaxed) {
            true => DeadlineMode::Observe,
            false => DeadlineMode::Propagate,
        }
    }

    /// Switches to `mode` for every request that starts from now on; returns the mode
    /// it replaced.
    pub fn set(&self, mode: DeadlineMode) -> DeadlineMode {
        let observe = mode == DeadlineMode::Observe;
        match self.observe.swap(observe, Ordering::Relaxed) {
            true => DeadlineMode::Observe,
            false => DeadlineMode::Propagate,
        }
    }
}

/// The observe marker's name, as sent.
pub const DEADLINE_MODE_HEADER: HeaderName = HeaderName::from_static("x-deadline-mode");

/// The marker's name as problems spell it.
pub(crate) const DEADLINE_MODE_HEADER_DISPLAY: &str = "X-Deadline-Mode";

/// The one value the marker has (the client sends it).
#[cfg(any(feature = "http-client", feature = "grpc"))]
pub(crate) const OBSERVE: http::HeaderValue = http::HeaderValue::from_static("observe");

/// Whether `headers` ask for observe mode: `observe` (any case, repeats allowed), or
/// nothing; anything else is an error naming the value, since a misspelt marker would
/// otherwise be enforced without anyone noticing.
pub(crate) fn observe_requested(headers: &HeaderMap) -> Result<bool, String> {
    let mut observe = false;
    for value in headers.get_all(DEADLINE_MODE_HEADER) {
        if !value
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"observe")
        {
            return Err(format!(
                "{DEADLINE_MODE_HEADER_DISPLAY} must be \"observe\", got {:?}",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
        observe = true;
    }
    Ok(observe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_and_write_as_lowercase_names() {
        for mode in DeadlineMode::ALL {
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{}\"", mode.as_str()));
            assert_eq!(serde_json::from_str::<DeadlineMode>(&json).unwrap(), mode);
        }
    }

    #[test]
    fn a_switch_is_seen_by_every_clone() {
        let mode = LiveMode::new(DeadlineMode::Observe);
        let seen_by_ingress = mode.clone();
        for next in DeadlineMode::ALL {
            mode.set(next);
            assert_eq!(seen_by_ingress.get(), next);
        }
    }
}
