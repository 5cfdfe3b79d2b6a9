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

use crate::mode::DeadlineMode;
use crate::stage::Stage;
use crate::timing::StageLog;

mod live;
mod no_return;
mod policy;

pub use live::LiveMode;

pub use no_return::NO_RETURN_GRACE;
pub use policy::DeadlinePolicy;

/// The budget ran out before or during `stage`.
///
/// ```
/// use std::time::Duration;
/// use deadline_propagation::{Deadline, DeadlineExceeded, Problem, Stage};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let deadline = Deadline::after(Duration::ZERO);
/// let exceeded: DeadlineExceeded = deadline.run(Stage::Db, async {}).await.unwrap_err();
/// assert_eq!(exceeded.stage, Stage::Db);
/// // A handler's `?` turns it into the 504 problem of the contract.
/// assert_eq!(Problem::from(exceeded).status().as_u16(), 504);
/// # }
/// ```
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

/// An absolute deadline plus the budget it was created with.
///
/// Cheap to clone; clones (and [children](Deadline::child)) share one log of stages, so the
/// time every stage took ends up in the response's `Server-Timing` header.
///
/// ```
/// use std::time::Duration;
/// use deadline_propagation::{Deadline, Stage};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let deadline = Deadline::after(Duration::from_millis(300));
/// // Every I/O step runs under what is left, and is timed for `Server-Timing`.
/// let answer = deadline.run(Stage::named("catalog"), async { 42 }).await;
/// assert_eq!(answer, Ok(42));
/// assert!(deadline.remaining() <= Duration::from_millis(300));
/// # }
/// ```
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
        Self::with_log(Instant::now(), budget, Arc::new(StageLog::default()))
    }

    /// A deadline `budget` after `started` that records its stages into `log`. The
    /// ingress passes the instant the request arrived, which it also reads to time a
    /// refusal, so a request costs one clock read.
    pub(crate) fn with_log(started: Instant, budget: Duration, log: Arc<StageLog>) -> Self {
        Self {
            started,
            at: later_by(started, budget),
            budget,
            log,
            mode: DeadlineMode::Propagate,
        }
    }

    /// The same deadline, run in `mode`: only the ingress stamps it (the mode in force
    /// when the request arrived, see [`LiveMode`]), so that no request runs half in one
    /// mode and half in another.
    pub(crate) fn with_mode(mut self, mode: DeadlineMode) -> Self {
        self.mode = mode;
        self
    }

    /// The mode this request runs in: every step reads it here, so a mode switch never
    /// changes a request half-way.
    pub fn mode(&self) -> DeadlineMode {
        self.mode
    }

    /// Counts, in observe mode, a refusal propagate would have made in `stage`.
    pub(crate) fn would_refuse(&self, stage: Stage, reason: &'static str) {
        tracing::debug!(stage = stage.as_str(), reason, "propagate would refuse");
        self.log.count_would_refuse(stage, reason);
    }

    /// The ingress constructor: applies `policy` to the requested budget. Returns the
    /// deadline and whether the request was clamped.
    #[cfg(test)]
    pub(crate) fn inbound(requested: Option<Duration>, policy: &DeadlinePolicy) -> (Self, bool) {
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
        self.remaining_at(Instant::now())
    }

    /// What is left at `now`: for a step that reads the clock once for both what is
    /// left and when it started.
    pub(crate) fn remaining_at(&self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// True once nothing is left. No new I/O may start after this.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The budget to send downstream: `remaining - reserve` in whole milliseconds, or
    /// `None` when that is less than 1 ms: the budget is spent, and nothing is sent.
    ///
    /// The reserve leaves this hop time to turn the downstream's answer into its own. A
    /// budget no larger than the reserve has nothing left to hand on; sending the call
    /// anyway with a 1 ms header would only make the downstream do work whose answer
    /// arrives too late, so the caller must not send it and answers 504 instead.
    #[cfg(feature = "http-client")]
    pub(crate) fn outbound_millis(&self, reserve: Duration) -> Option<u64> {
        let ms = self.remaining().saturating_sub(reserve).as_millis();
        (ms > 0).then(|| u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// A deadline for a sub-task that may take at most `cap`: the earlier of this
    /// deadline and now + `cap`. A child never outlives its parent.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let request = deadline_propagation::Deadline::after(Duration::from_millis(300));
    /// // A tool call capped at 800 ms still ends with the request.
    /// let tool = request.child(Duration::from_millis(800));
    /// assert_eq!(tool.instant(), request.instant());
    /// ```
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
    pub(crate) fn log(&self) -> &Arc<StageLog> {
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
    ///
    /// ```
    /// # use std::time::Duration;
    /// use deadline_propagation::{Deadline, Stage};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let deadline = Deadline::after(Duration::from_millis(50));
    /// let slow = tokio::time::sleep(Duration::from_secs(10));
    /// // Cut at the deadline, not after 10 s; the sleep (or HTTP call) is dropped.
    /// let exceeded = deadline.run(Stage::named("catalog"), slow).await.unwrap_err();
    /// assert_eq!(exceeded.stage, Stage::named("catalog"));
    /// # }
    /// ```
    pub async fn run<F>(&self, stage: Stage, step: F) -> Result<F::Output, DeadlineExceeded>
    where
        F: IntoFuture,
    {
        // One read of the clock for both: what is left, and when the step started.
        let started = Instant::now();
        let remaining = self.remaining_at(started);
        self.log.observe_start(stage, remaining);
        if remaining.is_zero() {
            return Err(self.exceeded(stage));
        }
        let span = self.stage_span(stage);
        // Boxed once, so the timeout and the span wrap a pointer: each wrapper would
        // otherwise move the whole step by value, and an HTTP call's future is
        // kilobytes (measured: three such copies were a third of what propagate added
        // to an order's instructions in orders-service). Written into a box allocated
        // first, the step is made where it stays (`Box::pin` would make it, then copy
        // it in).
        let step = Box::into_pin(Box::write(Box::new_uninit(), step.into_future()));
        let outcome = tokio::time::timeout_at(self.at, step)
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
mod tests;
