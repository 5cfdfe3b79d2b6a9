//! [`DeadlineMode`]: how budgets are treated.
//!
//! Rolling the technique out is itself a risk: a budget that is too tight, or an
//! admission that refuses too eagerly, turns into errors for real users the moment it is
//! switched on. So there is a middle step, `observe` (Finagle's "dark mode"): everything
//! runs (budgets, headers, metrics, the latency estimate) but nothing is refused, and
//! `deadline_would_refuse_total{stage,reason}` counts what propagate would have refused.
//! When that count looks right, switch to `propagate`; if something goes wrong, switch
//! back. [`LiveMode`](crate::LiveMode) makes that a run-time switch.
//!
//! A leaf of the core: the stage log reports modes and the deadline carries one, so the
//! mode itself depends on neither.

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
#[serde(rename_all = "lowercase")]
pub enum DeadlineMode {
    /// Accept the client's budget (clamped), propagate it, answer 504 when it runs out.
    #[default]
    Propagate,
    /// Run the budget, headers, metrics and latency estimate, but refuse nothing: count
    /// what propagate would have refused. Each step waits as long as it would without
    /// the technique (a client's fixed [`timeout`](crate::client::ClientConfig::timeout),
    /// no statement limit).
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

    pub(crate) const fn to_u8(self) -> u8 {
        match self {
            DeadlineMode::Propagate => 0,
            DeadlineMode::Observe => 1,
        }
    }

    pub(crate) const fn from_u8(value: u8) -> Self {
        match value {
            1 => DeadlineMode::Observe,
            _ => DeadlineMode::Propagate,
        }
    }
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
}
