//! [`StageLog`]: where a request's budget went, for `Server-Timing` and the metrics.
//!
//! One log is shared by a request's [`Deadline`](crate::Deadline) and every clone or
//! child of it. Each stage records its duration; the ingress layer turns the entries into
//! a `Server-Timing` header so a browser's developer tools show where the budget went.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[cfg(feature = "metrics")]
use crate::metrics::DeadlineMetrics;
use crate::stage::Stage;

/// The stages a request went through, and the metrics they report to.
#[derive(Debug, Default)]
pub(crate) struct StageLog {
    entries: Mutex<Vec<(Stage, Duration)>>,
    /// Without the `metrics` feature a log only feeds `Server-Timing`.
    #[cfg(feature = "metrics")]
    metrics: Option<DeadlineMetrics>,
    /// How many steps of the request are past their point of no return (a COMMIT on the
    /// wire). See [`Deadline::point_of_no_return`](crate::Deadline::point_of_no_return).
    no_return: AtomicUsize,
}

impl StageLog {
    /// A log that also reports to a service's deadline metrics.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub(crate) fn with_metrics(metrics: DeadlineMetrics) -> Self {
        Self {
            entries: Mutex::default(),
            metrics: Some(metrics),
            no_return: AtomicUsize::new(0),
        }
    }

    /// Adds one finished stage.
    pub(crate) fn record(&self, stage: Stage, took: Duration) {
        self.lock().push((stage, took));
    }

    /// The stages recorded so far, in order.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> Vec<(Stage, Duration)> {
        self.lock().clone()
    }

    // The reports below go to the metrics when there are any; without the `metrics`
    // feature there are none and they do nothing.

    /// The ingress layer's report of the budget it accepted.
    #[cfg(feature = "axum")]
    pub(crate) fn observe_inbound(&self, budget: Duration, clamped: bool) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.observe_inbound(budget, clamped);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (budget, clamped);
    }

    pub(crate) fn observe_start(&self, stage: Stage, remaining: Duration) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.observe_remaining(stage, remaining);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (stage, remaining);
    }

    pub(crate) fn count_would_refuse(&self, stage: Stage, reason: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.count_would_refuse(stage, reason);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (stage, reason);
    }

    pub(crate) fn count_exceeded(&self, stage: Stage) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.count_exceeded(stage);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = stage;
    }

    /// Renders the entries as a `Server-Timing` value, followed by `total`.
    ///
    /// A stage that ran more than once (three tool calls) is summed into one entry with
    /// a count, since `Server-Timing` names should be unique.
    pub(crate) fn server_timing(&self, total: Duration) -> String {
        let mut sums: Vec<(Stage, Duration, u32)> = Vec::new();
        for (stage, took) in self.lock().iter() {
            match sums.iter_mut().find(|(s, _, _)| s == stage) {
                Some((_, sum, n)) => {
                    *sum += *took;
                    *n += 1;
                }
                None => sums.push((*stage, *took, 1)),
            }
        }
        let mut out = String::new();
        for (stage, took, n) in sums {
            let _ = write!(out, "{stage};dur={:.1}", millis(took));
            if n > 1 {
                let _ = write!(out, ";desc=\"{n} calls\"");
            }
            out.push_str(", ");
        }
        let _ = write!(out, "total;dur={:.1}", millis(total));
        out
    }

    /// True while a step of the request is past its point of no return.
    pub(crate) fn past_no_return(&self) -> bool {
        self.no_return.load(Ordering::Acquire) > 0
    }

    pub(crate) fn enter_no_return(&self) {
        self.no_return.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn leave_no_return(&self) {
        self.no_return.fetch_sub(1, Ordering::AcqRel);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Stage, Duration)>> {
        // A panic while holding this lock leaves a valid Vec behind; keep using it.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timing_lists_stages_in_order_then_total() {
        let log = StageLog::default();
        let catalog = crate::Downstream::new("catalog").unwrap();
        log.record(catalog.pool(), Duration::from_micros(100));
        log.record(Stage::named("catalog"), Duration::from_millis(12));
        log.record(Stage::Tool, Duration::from_millis(2));
        log.record(Stage::Tool, Duration::from_millis(3));
        assert_eq!(
            log.server_timing(Duration::from_millis(20)),
            "catalog_pool;dur=0.1, catalog;dur=12.0, tool;dur=5.0;desc=\"2 calls\", total;dur=20.0"
        );
    }
}
