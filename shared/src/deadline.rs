//! The [`Deadline`]: an absolute instant by which a request must be answered.
//!
//! Why absolute: a relative timeout ("300 ms") handed to each step in turn lets every step
//! spend the full amount, so three steps under "300 ms" can take 900 ms. An instant on the
//! monotonic clock is shared by every step, and each step gets only what is left.
//!
//! Why `tokio::time::Instant`: it is monotonic (wall-clock jumps cannot stretch a budget)
//! and it follows `tokio::time::pause()`, so the time logic is tested without sleeping.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::ingress::DeadlineMode;
use crate::stage::Stage;
use crate::timing::StageLog;

/// How an ingress turns a client's requested budget into an accepted one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadlinePolicy {
    /// The most this service ever grants, whatever the client asks for. Without it a
    /// client asking for 60 s would hold a worker, a pool slot and a database connection
    /// for 60 s.
    pub max: Duration,
    /// The budget of a request that sends no header.
    pub default: Duration,
}

impl DeadlinePolicy {
    /// The smallest budget ever granted: a request always gets one chance to run.
    pub const MIN: Duration = Duration::from_millis(1);

    /// A policy; `default` is itself clamped to `max`.
    pub fn new(max: Duration, default: Duration) -> Self {
        let max = max.max(Self::MIN);
        Self {
            max,
            default: default.clamp(Self::MIN, max),
        }
    }

    /// A policy from whole milliseconds, as configuration gives them.
    pub fn from_millis(max_ms: u64, default_ms: u64) -> Self {
        Self::new(
            Duration::from_millis(max_ms),
            Duration::from_millis(default_ms),
        )
    }

    /// The budget to accept: `clamp(requested, 1 ms, max)`, or the default when absent.
    /// The flag says whether the request was clamped, which is counted.
    pub fn accept(&self, requested: Option<Duration>) -> (Duration, bool) {
        match requested {
            None => (self.default, false),
            Some(asked) => {
                let accepted = asked.clamp(Self::MIN, self.max);
                (accepted, accepted != asked)
            }
        }
    }
}

/// The budget ran out before or during `stage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("deadline exceeded in stage {stage} after {elapsed:?} of a {budget:?} budget")]
pub struct DeadlineExceeded {
    /// Where the budget ran out.
    pub stage: Stage,
    /// The budget the request was granted at the ingress.
    pub budget: Duration,
    /// Time since the ingress accepted the request.
    pub elapsed: Duration,
}

/// How long past its deadline a request that is past its point of no return may still
/// answer. The database step bounds its own wait for a COMMIT's outcome by less than this
/// (`db::COMMIT_GRACE`), so this is only the ingress layer's backstop.
pub const NO_RETURN_GRACE: Duration = Duration::from_millis(500);

/// See [`Deadline::point_of_no_return`]; the request is past it until this is dropped.
#[derive(Debug)]
#[must_use = "the point of no return ends when this guard is dropped"]
pub struct NoReturn {
    log: Arc<StageLog>,
}

impl Drop for NoReturn {
    fn drop(&mut self) {
        self.log.leave_no_return();
    }
}

/// An absolute deadline plus the budget it was created with.
///
/// Cheap to clone; clones (and [children](Deadline::child)) share one [`StageLog`], so the
/// time every stage took ends up in the response's `Server-Timing` header.
#[derive(Clone, Debug)]
pub struct Deadline {
    started: Instant,
    at: Instant,
    budget: Duration,
    log: Arc<StageLog>,
    mode: DeadlineMode,
}

impl Deadline {
    /// A deadline `budget` from now, with a log of its own.
    pub fn after(budget: Duration) -> Self {
        Self::with_log(budget, Arc::new(StageLog::default()))
    }

    /// A deadline `budget` from now that records its stages into `log`.
    pub fn with_log(budget: Duration, log: Arc<StageLog>) -> Self {
        let started = Instant::now();
        Self {
            started,
            at: later_by(started, budget),
            budget,
            log,
            mode: DeadlineMode::Propagate,
        }
    }

    /// The same deadline, run in `mode` (the ingress stamps the mode in force when the
    /// request arrived; see [`LiveMode`](crate::ingress::LiveMode)).
    pub fn with_mode(mut self, mode: DeadlineMode) -> Self {
        self.mode = mode;
        self
    }

    /// The mode this request runs in: every step reads it here, so a mode switch never
    /// changes a request half-way.
    pub fn mode(&self) -> DeadlineMode {
        self.mode
    }

    /// Counts, in observe mode, a refusal propagate would have made in `stage`.
    pub fn would_refuse(&self, stage: Stage, reason: &'static str) {
        tracing::debug!(stage = stage.as_str(), reason, "propagate would refuse");
        self.log.count_would_refuse(stage, reason);
    }

    /// The ingress constructor: applies `policy` to the requested budget. Returns the
    /// deadline and whether the request was clamped.
    pub fn inbound(requested: Option<Duration>, policy: &DeadlinePolicy) -> (Self, bool) {
        let (budget, clamped) = policy.accept(requested);
        (Self::after(budget), clamped)
    }

    /// The instant by which the work must be done.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// The budget accepted at the ingress (for a child: its own, smaller budget).
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Time spent since the deadline was created.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// What is left; zero once the deadline has passed, never negative.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// True once nothing is left. No new I/O may start after this.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The budget to send downstream: `remaining - reserve` in whole milliseconds, or
    /// `None` when that is less than 1 ms: the budget is spent (docs/design.md §3).
    ///
    /// The reserve leaves this hop time to turn the downstream's answer into its own. A
    /// budget no larger than the reserve has nothing left to hand on; sending the call
    /// anyway with a 1 ms header would only make the downstream do work whose answer
    /// arrives too late, so the caller must not send it and answers 504 instead.
    pub fn outbound_millis(&self, reserve: Duration) -> Option<u64> {
        let ms = self.remaining().saturating_sub(reserve).as_millis();
        (ms > 0).then(|| u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// A deadline for a sub-task that may take at most `cap`: the earlier of this
    /// deadline and now + `cap`. A child never outlives its parent.
    pub fn child(&self, cap: Duration) -> Self {
        let now = Instant::now();
        let at = self.at.min(later_by(now, cap));
        Self {
            started: now,
            at,
            budget: at.saturating_duration_since(now),
            log: Arc::clone(&self.log),
            mode: self.mode,
        }
    }

    /// The log that records this request's stages.
    pub fn log(&self) -> &Arc<StageLog> {
        &self.log
    }

    /// Describes the budget as spent so far, for errors raised outside [`run`](Self::run).
    pub fn exceeded(&self, stage: Stage) -> DeadlineExceeded {
        self.log.count_exceeded(stage);
        DeadlineExceeded {
            stage,
            budget: self.budget,
            elapsed: self.elapsed(),
        }
    }

    /// Runs one I/O step under what is left of the budget.
    ///
    /// This is the one rule of the technique in code: if nothing is left, the step is
    /// never started (a future that is never polled does no I/O); otherwise it is
    /// raced against the deadline and dropped when the deadline fires. Dropping the
    /// future is what cancels its work: a reqwest future closes its connection, a
    /// semaphore waiter leaves the queue. The time the step took is logged under
    /// `stage` for `Server-Timing` and the metrics.
    pub async fn run<F>(&self, stage: Stage, step: F) -> Result<F::Output, DeadlineExceeded>
    where
        F: IntoFuture,
    {
        let remaining = self.remaining();
        self.log.observe_start(stage, remaining);
        if remaining.is_zero() {
            return Err(self.exceeded(stage));
        }
        let span = self.stage_span(stage);
        let started = Instant::now();
        let outcome = tokio::time::timeout_at(self.at, step.into_future())
            .instrument(span.clone())
            .await;
        self.log.record(stage, started.elapsed());
        match outcome {
            Ok(output) => Ok(output),
            Err(_elapsed) => {
                span.record("outcome", "deadline_exceeded");
                Err(self.exceeded(stage))
            }
        }
    }

    /// The span of one stage. `debug`: recorded when traces are exported (the
    /// OpenTelemetry layer has its own filter), free otherwise. See `telemetry`.
    pub(crate) fn stage_span(&self, stage: Stage) -> tracing::Span {
        tracing::debug_span!(
            "stage",
            otel.name = stage.as_str(),
            stage = stage.as_str(),
            deadline.budget_ms = self.budget.as_millis() as u64,
            deadline.remaining_ms = self.remaining().as_millis() as u64,
            outcome = tracing::field::Empty,
        )
    }

    /// Marks the request as past a point of no return (a COMMIT on the wire) until the
    /// guard is dropped.
    ///
    /// Once a COMMIT is sent, the server may commit whatever the client does, so an
    /// answer at the deadline could no longer say "nothing was written" truthfully. While
    /// a guard lives, the ingress layer does not answer 504 at the deadline; it waits up
    /// to [`NO_RETURN_GRACE`] longer for the handler, which learns the outcome and
    /// answers by it.
    pub fn point_of_no_return(&self) -> NoReturn {
        self.log.enter_no_return();
        NoReturn {
            log: Arc::clone(&self.log),
        }
    }
}

/// `from + by`, or a far instant when that is past what the clock can represent.
///
/// `Instant + Duration` panics on overflow, and a budget of `Duration::MAX` (a caller's
/// "no limit") is a valid input, not a reason to crash. Thirty years is tokio's own
/// "far future": a deadline that never fires in practice.
fn later_by(from: Instant, by: Duration) -> Instant {
    const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    from.checked_add(by).unwrap_or_else(|| from + FAR_FUTURE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn policy() -> DeadlinePolicy {
        DeadlinePolicy::new(MS(500), MS(300))
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_above_the_maximum_is_clamped_to_it() {
        let (deadline, clamped) = Deadline::inbound(Some(MS(60_000)), &policy());
        assert_eq!(deadline.budget(), MS(500));
        assert_eq!(deadline.remaining(), MS(500));
        assert!(clamped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_budget_is_raised_to_one_millisecond() {
        let (deadline, clamped) = Deadline::inbound(Some(MS(0)), &policy());
        assert_eq!(deadline.budget(), MS(1));
        assert!(clamped);
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_within_bounds_is_kept_and_not_counted_as_clamped() {
        let (deadline, clamped) = Deadline::inbound(Some(MS(250)), &policy());
        assert_eq!(deadline.budget(), MS(250));
        assert!(!clamped);
    }

    #[tokio::test(start_paused = true)]
    async fn an_absent_budget_gets_the_default() {
        let (deadline, clamped) = Deadline::inbound(None, &policy());
        assert_eq!(deadline.budget(), MS(300));
        assert!(!clamped);
    }

    #[test]
    fn a_default_above_the_maximum_is_clamped_too() {
        assert_eq!(DeadlinePolicy::new(MS(100), MS(5000)).default, MS(100));
    }

    #[tokio::test(start_paused = true)]
    async fn remaining_saturates_at_zero() {
        let deadline = Deadline::after(MS(100));
        tokio::time::advance(MS(60)).await;
        assert_eq!(deadline.remaining(), MS(40));
        assert!(!deadline.is_expired());
        tokio::time::advance(MS(500)).await;
        assert_eq!(deadline.remaining(), Duration::ZERO);
        assert!(deadline.is_expired());
    }

    #[tokio::test(start_paused = true)]
    async fn the_outbound_budget_subtracts_the_reserve_and_is_spent_at_the_reserve() {
        let deadline = Deadline::after(MS(300));
        assert_eq!(deadline.outbound_millis(MS(5)), Some(295));
        tokio::time::advance(MS(294)).await;
        assert_eq!(deadline.outbound_millis(MS(5)), Some(1));
        tokio::time::advance(Duration::from_micros(500)).await;
        assert_eq!(
            deadline.outbound_millis(MS(5)),
            None,
            "less than 1 ms to hand on"
        );
        tokio::time::advance(MS(1)).await;
        assert_eq!(
            deadline.outbound_millis(MS(5)),
            None,
            "no more than the reserve"
        );
        tokio::time::advance(MS(10)).await;
        assert_eq!(deadline.outbound_millis(MS(5)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_too_large_for_the_clock_saturates_instead_of_panicking() {
        let endless = Deadline::after(Duration::MAX);
        assert!(!endless.is_expired());
        assert!(endless.remaining() > Duration::from_secs(365 * 24 * 3600));
        assert_eq!(endless.child(Duration::MAX).instant(), endless.instant());
        let short = Deadline::after(MS(100));
        assert_eq!(short.child(Duration::MAX).instant(), short.instant());
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_never_outlives_its_parent() {
        let parent = Deadline::after(MS(1000));
        let short = parent.child(MS(800));
        assert_eq!(short.instant(), parent.instant() - MS(200));
        tokio::time::advance(MS(600)).await;
        let late = parent.child(MS(800));
        assert_eq!(late.instant(), parent.instant());
        assert_eq!(late.budget(), MS(400));
    }

    #[tokio::test(start_paused = true)]
    async fn run_cuts_a_slow_step_at_the_deadline() {
        let deadline = Deadline::after(MS(300));
        let result = deadline
            .run(Stage::Catalog, tokio::time::sleep(MS(1000)))
            .await;
        let err = result.expect_err("a 1 s step under 300 ms must time out");
        assert_eq!(err.stage, Stage::Catalog);
        assert_eq!(err.elapsed, MS(300));
    }

    #[tokio::test(start_paused = true)]
    async fn run_never_starts_a_step_once_the_deadline_has_passed() {
        let deadline = Deadline::after(MS(10));
        tokio::time::advance(MS(10)).await;
        let started = std::sync::atomic::AtomicBool::new(false);
        let result = deadline
            .run(Stage::Db, async {
                started.store(true, std::sync::atomic::Ordering::SeqCst);
            })
            .await;
        assert_eq!(result.map_err(|e| e.stage), Err(Stage::Db));
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn run_records_each_stage_in_the_shared_log() {
        let deadline = Deadline::after(MS(1000));
        let child = deadline.child(MS(100));
        deadline
            .run(Stage::Catalog, tokio::time::sleep(MS(20)))
            .await
            .unwrap();
        child
            .run(Stage::Tool, tokio::time::sleep(MS(5)))
            .await
            .unwrap();
        let entries = deadline.log().entries();
        assert_eq!(
            entries,
            vec![(Stage::Catalog, MS(20)), (Stage::Tool, MS(5))]
        );
    }
}
