//! `tool_calls_total{tool_name,outcome}`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::metrics::names::{TOOL_CALLS_TOTAL, registered};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool_name: String,
    outcome: &'static str,
}

/// `tool_calls_total{tool_name,outcome}`.
#[derive(Clone, Debug)]
pub(crate) struct ToolMetrics {
    calls: Family<ToolLabels, Counter>,
}

impl ToolMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            calls: Family::default(),
        };
        registry.register(
            registered(TOOL_CALLS_TOTAL),
            "Assistant tool calls by tool and outcome",
            this.calls.clone(),
        );
        this
    }

    /// Makes every `tool × outcome` series exist at 0 before the first call, so a
    /// dashboard panel or a `rate()` over a tool that has not run yet shows 0 instead of
    /// nothing, and the first call is counted as an increase from 0 (a series that
    /// appears at 1 is a rate of 0 to Prometheus).
    pub(crate) fn init<'a>(
        &self,
        tool_names: impl IntoIterator<Item = &'a str>,
        outcomes: &[&'static str],
    ) {
        for tool_name in tool_names {
            for &outcome in outcomes {
                let _ = self.calls.get_or_create(&ToolLabels {
                    tool_name: tool_name.to_owned(),
                    outcome,
                });
            }
        }
    }

    /// Counts one tool call.
    pub(crate) fn count(&self, tool_name: &str, outcome: &'static str) {
        self.calls
            .get_or_create(&ToolLabels {
                tool_name: tool_name.to_owned(),
                outcome,
            })
            .inc();
    }
}
