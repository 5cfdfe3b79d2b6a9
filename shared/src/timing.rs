//! [`StageLog`]: where a request's budget went, for `Server-Timing` and the metrics.
//!
//! One log is shared by a request's [`Deadline`](crate::Deadline) and every clone or
//! child of it. Each stage records its duration; the ingress layer turns the entries into
//! a `Server-Timing` header so a browser's developer tools show where the budget went.
//!
//! The log also passes what happens to the budget (accepted, left at a stage's start,
//! run out, what observe mode would have refused) to a [`Report`], when the service has
//! one. The core defines the trait and knows nothing of who implements it: the metrics
//! (feature `metrics`) do, from above, so the core builds and reads the same with or
//! without them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::stage::Stage;

/// What the core reports about budgets, in plain labels: the metrics implement it.
pub(crate) trait Report: Send + Sync + std::fmt::Debug {
    /// The ingress accepted `budget`, clamped or not.
    fn inbound(&self, budget: Duration, clamped: bool);
    /// `stage` starts with `remaining` of the budget.
    fn stage_started(&self, stage: Stage, remaining: Duration);
    /// The budget ran out in `stage`.
    fn exceeded(&self, stage: Stage);
    /// In observe mode, propagate would have refused in `stage` for `reason`.
    fn would_refuse(&self, stage: Stage, reason: &'static str);
}

/// Where a log or the layer reports; `None` where the service has no
/// metrics.
pub(crate) type Reporter = Option<Arc<dyn Report>>;

/// The stages a request went through, and where they are reported.
#[derive(Debug, Default)]
pub(crate) struct StageLog {
    entries: Mutex<Vec<(Stage, Duration)>>,
    report: Reporter,
    /// How many steps of the request are past their point of no return (a COMMIT on the
    /// wire). See [`Deadline::point_of_no_return`](crate::Deadline::point_of_no_return).
    no_return: AtomicUsize,
}

impl StageLog {
    /// A log that also reports to `report` (the ingress builds each request's so).
    pub(crate) fn reporting(report: Reporter) -> Self {
        Self {
            entries: Mutex::default(),
            report,
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

    /// The ingress layer's report of the budget it accepted.
    pub(crate) fn observe_inbound(&self, budget: Duration, clamped: bool) {
        if let Some(report) = &self.report {
            report.inbound(budget, clamped);
        }
    }

    pub(crate) fn observe_start(&self, stage: Stage, remaining: Duration) {
        if let Some(report) = &self.report {
            report.stage_started(stage, remaining);
        }
    }

    pub(crate) fn count_would_refuse(&self, stage: Stage, reason: &'static str) {
        if let Some(report) = &self.report {
            report.would_refuse(stage, reason);
        }
    }

    pub(crate) fn count_exceeded(&self, stage: Stage) {
        if let Some(report) = &self.report {
            report.exceeded(stage);
        }
    }

    /// Renders the entries as a `Server-Timing` value, followed by `total`.
    ///
    /// A stage that ran more than once (three tool calls) is summed into one entry with
    /// a count, since `Server-Timing` names should be unique. The ingress writes it.
    pub(crate) fn server_timing(&self, total: Duration) -> String {
        use std::fmt::Write as _;

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
        // Sized for a request's usual handful of stages, so it is not grown on the way.
        // Written piece by piece rather than with `write!`: every response carries the
        // header, and the formatting machinery cost more than the rest of it.
        let mut out = String::with_capacity(160);
        for (stage, took, n) in sums {
            out.push_str(stage.as_str());
            out.push_str(";dur=");
            Tenths::of(took).push_to(&mut out);
            if n > 1 {
                let _ = write!(out, ";desc=\"{n} calls\"");
            }
            out.push_str(", ");
        }
        out.push_str("total;dur=");
        Tenths::of(total).push_to(&mut out);
        out
    }

    /// True while a step of the request is past its point of no return (the ingress
    /// waits a grace for its answer, and the client sends no extra attempt).
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

/// A duration in milliseconds with one decimal, rounded to the nearest tenth, written
/// from integers: every response carries a few, and formatting them as floats cost
/// more than the rest of the header.
struct Tenths(u64);

impl Tenths {
    fn of(d: Duration) -> Self {
        let tenths = (d.as_nanos() + 50_000) / 100_000;
        Self(u64::try_from(tenths).unwrap_or(u64::MAX))
    }

    /// Appends `12.3` for 123 tenths.
    fn push_to(&self, out: &mut String) {
        out.push_str(itoa::Buffer::new().format(self.0 / 10));
        out.push('.');
        out.push(char::from(b'0' + (self.0 % 10) as u8));
    }
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

    #[test]
    fn durations_are_milliseconds_rounded_to_the_nearest_tenth() {
        let tenths = |nanos: u64| {
            let mut out = String::new();
            Tenths::of(Duration::from_nanos(nanos)).push_to(&mut out);
            out
        };
        assert_eq!(tenths(0), "0.0");
        assert_eq!(tenths(49_999), "0.0");
        assert_eq!(tenths(50_000), "0.1");
        assert_eq!(tenths(1_249_999), "1.2");
        assert_eq!(tenths(1_250_000), "1.3");
        assert_eq!(tenths(700_000_000), "700.0");
        assert_eq!(tenths(12_345_678_901), "12345.7");
    }
}
