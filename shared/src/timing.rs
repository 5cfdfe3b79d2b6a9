//! [`StageLog`]: where a request's budget went. One log is shared by a request's
//! [`Deadline`](crate::Deadline) and its clones; the ingress turns it into a
//! `Server-Timing` header (a browser's developer tools show it), and it tells a
//! [`Report`] (the metrics, from above) what happens to the budget.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

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
    /// The service answered `overrun` after its deadline (zero when in time).
    fn answered(&self, overrun: Duration);
}

/// The stages a request went through, and where they are reported.
#[derive(Debug, Default)]
pub(crate) struct StageLog {
    entries: Mutex<Vec<(Stage, Duration)>>,
    report: Option<Arc<dyn Report>>,
    /// Steps of the request past their point of no return (a COMMIT on the wire).
    no_return: AtomicUsize,
    /// A downstream may have acted on a write of this request, for good.
    acted: AtomicBool,
    /// `Server-Timing` says only `total`.
    total_only: bool,
}

impl StageLog {
    /// A log that also reports to `report` (the ingress makes each request's so).
    pub(crate) fn reporting(report: Option<Arc<dyn Report>>) -> Self {
        Self {
            report,
            ..Self::default()
        }
    }

    /// The same log, naming its stages in `Server-Timing` or not.
    pub(crate) fn timing_stages(mut self, stages: bool) -> Self {
        self.total_only = !stages;
        self
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

    /// Tells the report, if there is one.
    fn report(&self, tell: impl FnOnce(&dyn Report)) {
        if let Some(report) = &self.report {
            tell(report.as_ref());
        }
    }

    pub(crate) fn observe_inbound(&self, budget: Duration, clamped: bool) {
        self.report(|r| r.inbound(budget, clamped));
    }

    pub(crate) fn observe_start(&self, stage: Stage, remaining: Duration) {
        self.report(|r| r.stage_started(stage, remaining));
    }

    pub(crate) fn count_would_refuse(&self, stage: Stage, reason: &'static str) {
        self.report(|r| r.would_refuse(stage, reason));
    }

    pub(crate) fn count_exceeded(&self, stage: Stage) {
        self.report(|r| r.exceeded(stage));
    }

    /// The service answers now: how late past `deadline`, each hop's own promise to
    /// its caller (`deadline_overrun_seconds`).
    pub(crate) fn observe_answered(&self, deadline: Instant) {
        // The clock is read only where a report listens.
        self.report(|r| r.answered(Instant::now().saturating_duration_since(deadline)));
    }

    /// The entries as a `Server-Timing` value, followed by `total`. A stage that ran
    /// more than once (three tool calls) is summed, with a count: names should be
    /// unique. Written piece by piece: every response carries it.
    pub(crate) fn server_timing(&self, total: Duration) -> String {
        let mut sums: Vec<(Stage, Duration, u32)> = Vec::new();
        for (stage, took) in self.lock().iter().filter(|_| !self.total_only) {
            match sums.iter_mut().find(|(s, _, _)| s == stage) {
                Some((_, sum, n)) => {
                    *sum += *took;
                    *n += 1;
                }
                None => sums.push((*stage, *took, 1)),
            }
        }
        let mut out = String::with_capacity(160);
        for (stage, took, n) in sums {
            out.push_str(stage.as_str());
            out.push_str(";dur=");
            push_tenths(&mut out, took);
            if n > 1 {
                out.push_str(";desc=\"");
                out.push_str(itoa::Buffer::new().format(n));
                out.push_str(" calls\"");
            }
            out.push_str(", ");
        }
        out.push_str("total;dur=");
        push_tenths(&mut out, total);
        out
    }

    /// True while a step of the request is past its point of no return: the ingress
    /// waits a grace for its answer, and the client sends no extra attempt.
    pub(crate) fn past_no_return(&self) -> bool {
        self.no_return.load(Ordering::Acquire) > 0
    }

    pub(crate) fn enter_no_return(&self) {
        self.no_return.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn leave_no_return(&self) {
        self.no_return.fetch_sub(1, Ordering::AcqRel);
    }

    /// A downstream may have acted on a write of this request: from now on no answer to
    /// it may say that nothing was written (the ingress sees to it).
    #[cfg(feature = "http-client")]
    pub(crate) fn mark_acted(&self) {
        self.acted.store(true, Ordering::Release);
    }

    pub(crate) fn acted(&self) -> bool {
        self.acted.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Stage, Duration)>> {
        // A panic while holding this lock leaves a valid Vec behind; keep using it.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Appends `d` in milliseconds with one decimal, rounded to the nearest tenth.
fn push_tenths(out: &mut String, d: Duration) {
    let tenths = u64::try_from((d.as_nanos() + 50_000) / 100_000).unwrap_or(u64::MAX);
    out.push_str(itoa::Buffer::new().format(tenths / 10));
    out.push('.');
    out.push(char::from(b'0' + (tenths % 10) as u8));
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
            push_tenths(&mut out, Duration::from_nanos(nanos));
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
