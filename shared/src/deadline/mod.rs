//! The [`Deadline`]: an absolute instant by which a request must be answered.
//!
//! Why absolute: a relative timeout handed to each step in turn lets every step spend
//! all of it, so three steps under "300 ms" take 900 ms; an instant is shared, and each
//! step gets only what is left. Why `tokio::time::Instant`: it is monotonic, and it
//! follows `tokio::time::pause()`, so the time logic is tested without sleeping.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::mode::DeadlineMode;
use crate::stage::Stage;
use crate::timing::StageLog;

#[cfg(feature = "grpc")]
mod current;
mod policy;

pub use policy::DeadlinePolicy;

/// How long past its deadline a request past its point of no return may still answer:
/// the ingress's backstop (the database bounds its own wait for a COMMIT by less).
pub const NO_RETURN_GRACE: Duration = Duration::from_millis(500);

/// How long past the deadline a COMMIT or a write's outcome is waited for, to learn it.
#[cfg(any(feature = "http-client", feature = "sqlx"))]
pub(crate) const OUTCOME_GRACE: Duration = Duration::from_millis(250);

/// The budget ran out before or during `stage`; a handler's `?` turns it into the 504
/// problem of the contract.
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

/// An absolute deadline, the budget it was made with, and the mode it runs in. Cheap to
/// clone; clones and [children](Deadline::child) share one log of stages, so every
/// stage's time ends up in the response's `Server-Timing` header.
#[derive(Clone, Debug)]
pub struct Deadline {
    started: Instant,
    at: Instant,
    budget: Duration,
    log: Arc<StageLog>,
    mode: DeadlineMode,
    previous_attempts: Option<u32>,
}

impl Deadline {
    /// A deadline `budget` from now, with a log of its own.
    pub fn after(budget: Duration) -> Self {
        Self::with_log(Instant::now(), budget, Arc::default())
    }

    /// A deadline `budget` after `started`, recording into `log`.
    pub(crate) fn with_log(started: Instant, budget: Duration, log: Arc<StageLog>) -> Self {
        Self {
            started,
            at: later_by(started, budget),
            budget,
            log,
            mode: DeadlineMode::Propagate,
            previous_attempts: None,
        }
    }

    /// The same deadline, run in `mode` (the ingress stamps the mode in force; a job
    /// started elsewhere may choose its own).
    pub fn with_mode(mut self, mode: DeadlineMode) -> Self {
        self.mode = mode;
        self
    }

    /// The same deadline, with `n` attempts made for it by a caller above.
    pub(crate) fn with_previous_attempts(mut self, n: Option<u32>) -> Self {
        self.previous_attempts = n;
        self
    }

    /// How many attempts a caller above made before this one, if it sent
    /// `X-Previous-Attempts`: it owns retries and hedges for the request, so calls made
    /// under this deadline make no extra attempts and retries do not multiply by hop.
    pub fn previous_attempts(&self) -> Option<u32> {
        self.previous_attempts
    }

    /// The mode this request runs in: every step reads it here.
    pub fn mode(&self) -> DeadlineMode {
        self.mode
    }

    /// The instant by which the work must be done.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// The budget accepted at the ingress (for a child: its own, smaller budget).
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Time spent since the deadline was made.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// What is left; zero once the deadline has passed, never negative.
    pub fn remaining(&self) -> Duration {
        self.remaining_at(Instant::now())
    }

    /// What is left at `now` (a step that reads the clock once).
    pub(crate) fn remaining_at(&self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// True once nothing is left. No new I/O may start after this.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The budget to send downstream: `remaining - keep_back` in whole milliseconds, or
    /// `None` when that is less than 1 ms: then the call must not be sent (its answer
    /// would come too late), and the caller answers 504 instead.
    pub fn outbound_millis(&self, keep_back: Duration) -> Option<u64> {
        let ms = self.remaining().saturating_sub(keep_back).as_millis();
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
            previous_attempts: self.previous_attempts,
        }
    }

    /// The log that records this request's stages.
    pub(crate) fn log(&self) -> &Arc<StageLog> {
        &self.log
    }

    /// The budget as spent so far, for errors raised outside [`run`](Self::run).
    pub fn exceeded(&self, stage: Stage) -> DeadlineExceeded {
        self.log.count_exceeded(stage);
        DeadlineExceeded {
            stage,
            budget: self.budget,
            elapsed: self.elapsed(),
        }
    }

    /// Counts, in observe mode, a refusal propagate would have made in `stage`.
    pub(crate) fn would_refuse(&self, stage: Stage, reason: &'static str) {
        tracing::debug!(stage = stage.as_str(), reason, "propagate would refuse");
        self.log.count_would_refuse(stage, reason);
    }

    /// Runs one I/O step under what is left of the budget: the technique's one rule.
    ///
    /// If nothing is left, the step never starts (a future never polled does no I/O);
    /// otherwise it is raced against the deadline and dropped when it fires, which is
    /// what cancels its work: a reqwest future closes its connection, a waiter leaves
    /// its queue. Its time is logged under `stage` for `Server-Timing` and the metrics.
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
        let started = Instant::now();
        let remaining = self.remaining_at(started);
        self.log.observe_start(stage, remaining);
        if remaining.is_zero() {
            return Err(self.exceeded(stage));
        }
        let span = self.stage_span(stage);
        // Boxed where it is made (an HTTP call's future is large): the timeout and
        // the span then wrap a pointer instead of moving the step.
        let step = Box::into_pin(Box::write(Box::new_uninit(), step.into_future()));
        let outcome = tokio::time::timeout_at(self.at, step)
            .instrument(span.clone())
            .await;
        self.log.record(stage, started.elapsed());
        outcome.map_err(|_elapsed| {
            span.record("outcome", "deadline_exceeded");
            self.exceeded(stage)
        })
    }

    /// The span of one stage.
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
    /// guard is dropped. Once a COMMIT is sent the server may commit whatever the
    /// client does, so a 504 at the deadline could no longer truthfully say "nothing
    /// was written": the ingress waits up to [`NO_RETURN_GRACE`] more for the handler,
    /// which answers by the outcome.
    #[must_use = "the point of no return ends when this guard is dropped"]
    pub fn point_of_no_return(&self) -> impl std::fmt::Debug + Send + Sync + 'static {
        self.log.enter_no_return();
        NoReturn(Arc::clone(&self.log))
    }
}

/// See [`Deadline::point_of_no_return`].
#[derive(Debug)]
struct NoReturn(Arc<StageLog>);

impl Drop for NoReturn {
    fn drop(&mut self) {
        self.0.leave_no_return();
    }
}

/// `from + by`, or thirty years on (tokio's own far future) when that is past what the
/// clock holds: a budget of `Duration::MAX` is a valid input, not a reason to panic.
fn later_by(from: Instant, by: Duration) -> Instant {
    const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    from.checked_add(by).unwrap_or_else(|| from + FAR_FUTURE)
}

#[cfg(test)]
mod tests;
