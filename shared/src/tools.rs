//! [`ToolBudget`]: numeric quotas for the tool calls of one AI assistant turn.
//!
//! An assistant turn may call several tools, and each tool does real I/O (a catalog
//! call, a SQL query) on the same pools as ordinary requests. Without quotas one chatty
//! agent drains those pools. By default a turn gets 2 s (never more than the request's
//! own deadline), each tool at most 800 ms of what is left of the turn, and at most 3
//! calls; a fourth is refused without running.
//!
//! A tool's own HTTP and SQL work runs under the tool's deadline (a
//! [child](crate::Deadline::child) of the turn), so a cut tool leaves nothing behind.
//! Cancellation (an MCP `notifications/cancelled`, a client that goes away) is
//! cooperative: the tool future is raced against a `CancellationToken` and dropped, which
//! drops its HTTP request; SQL needs the server to be told, which the
//! `db` module (feature `sqlx`) does when its caller's future is dropped.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::deadline::Deadline;
use crate::problem::Problem;
use crate::stage::Stage;

/// The quotas of a turn: the defaults, which fields may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ToolPolicy {
    /// The whole turn (default 2 s), never more than the request's own deadline.
    pub turn: Duration,
    /// One tool call at most, of what is left of the turn (default 800 ms).
    pub per_tool: Duration,
    /// Tool calls per turn at most (default 3).
    pub max_calls: u32,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        Self {
            turn: Duration::from_millis(2000),
            per_tool: Duration::from_millis(800),
            max_calls: 3,
        }
    }
}

/// How a tool call ended (`tool_calls_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolOutcome {
    /// It returned a result.
    Ok,
    /// It failed (a 4xx/5xx from its work).
    Error,
    /// Its budget ran out.
    Timeout,
    /// It was not run: the turn's call quota was used up, or nothing was left of the turn.
    Refused,
    /// The caller cancelled it while it ran.
    Cancelled,
}

impl ToolOutcome {
    /// Every outcome, for series that must exist before the first call.
    pub const ALL: [ToolOutcome; 5] = [
        ToolOutcome::Ok,
        ToolOutcome::Error,
        ToolOutcome::Timeout,
        ToolOutcome::Refused,
        ToolOutcome::Cancelled,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::Error => "error",
            ToolOutcome::Timeout => "timeout",
            ToolOutcome::Refused => "refused",
            ToolOutcome::Cancelled => "cancelled",
        }
    }
}

/// The record of one tool call.
///
/// ```
/// use std::time::Duration;
/// use deadline_propagation::tools::{ToolOutcome, ToolBudget, ToolPolicy};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let budget = ToolBudget::for_turn(&deadline_propagation::Deadline::after(Duration::from_secs(5)), ToolPolicy::default());
/// let call = budget.call("echo", &CancellationToken::new(), |_| async { Ok("hi") }).await;
/// // What the assistant endpoint returns for each call, as JSON.
/// assert_eq!(call.outcome, ToolOutcome::Ok);
/// assert_eq!(serde_json::to_value(&call).unwrap()["result"], "hi");
/// # }
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct ToolCall<T> {
    /// The tool's name.
    pub tool: String,
    /// How it ended.
    pub outcome: ToolOutcome,
    /// How long it ran.
    pub elapsed_ms: u64,
    /// Its result, when `outcome` is `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<T>,
    /// What went wrong, otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The budget of one turn. Calls are counted as they are made.
///
/// ```
/// use std::time::Duration;
/// use deadline_propagation::tools::{ToolOutcome, ToolBudget, ToolPolicy};
/// use deadline_propagation::{Deadline, Stage};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let request = Deadline::after(Duration::from_secs(5));
/// let budget = ToolBudget::for_turn(&request, ToolPolicy::default());
/// let cancel = CancellationToken::new();
/// // A tool that would take 2 s is cut at its 800 ms cap.
/// let call = budget
///     .call("catalog_lookup", &cancel, |deadline| async move {
///         deadline.run(Stage::named("catalog"), tokio::time::sleep(Duration::from_secs(2))).await?;
///         Ok(())
///     })
///     .await;
/// assert_eq!(call.outcome, ToolOutcome::Timeout);
/// # }
/// ```
pub struct ToolBudget {
    turn: Deadline,
    policy: ToolPolicy,
    calls: AtomicU32,
    /// Told how every call ended (the metrics count it).
    observer: Option<Observer>,
}

/// What is told how each call ended: the tool's name and its outcome.
type Observer = std::sync::Arc<dyn Fn(&str, ToolOutcome) + Send + Sync>;

impl std::fmt::Debug for ToolBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolBudget")
            .field("turn", &self.turn)
            .field("policy", &self.policy)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl ToolBudget {
    /// A turn inside `request`'s deadline: it ends at the earlier of the two.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use deadline_propagation::tools::{ToolBudget, ToolPolicy};
    ///
    /// let request = deadline_propagation::Deadline::after(Duration::from_millis(500));
    /// // A 2 s turn inside a 500 ms request ends with the request.
    /// let budget = ToolBudget::for_turn(&request, ToolPolicy::default());
    /// assert_eq!(budget.turn().instant(), request.instant());
    /// ```
    pub fn for_turn(request: &Deadline, policy: ToolPolicy) -> Self {
        Self {
            turn: request.child(policy.turn),
            policy,
            calls: AtomicU32::new(0),
            observer: None,
        }
    }

    /// Tells `observer` how each call ended, by the tool's name.
    pub fn observed(
        mut self,
        observer: impl Fn(&str, ToolOutcome) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(std::sync::Arc::new(observer));
        self
    }

    /// The turn's deadline.
    pub fn turn(&self) -> &Deadline {
        &self.turn
    }

    /// Runs `tool` under `min(per_tool, what is left of the turn)`, unless the quota is
    /// used up or the turn is over; stops it when `cancel` fires.
    ///
    /// `tool` receives the call's own deadline and must run all its I/O under it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use deadline_propagation::tools::{ToolOutcome, ToolBudget, ToolPolicy};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let mut policy = ToolPolicy::default();
    /// policy.max_calls = 1;
    /// let budget = ToolBudget::for_turn(&deadline_propagation::Deadline::after(Duration::from_secs(5)), policy);
    /// let never = CancellationToken::new();
    /// let first = budget.call("inventory_check", &never, |_| async { Ok(7) }).await;
    /// let second = budget.call("inventory_check", &never, |_| async { Ok(7) }).await;
    /// assert_eq!((first.outcome, second.outcome), (ToolOutcome::Ok, ToolOutcome::Refused));
    /// # }
    /// ```
    pub async fn call<T, F, Fut>(
        &self,
        name: &str,
        cancel: &CancellationToken,
        tool: F,
    ) -> ToolCall<T>
    where
        F: FnOnce(Deadline) -> Fut,
        Fut: Future<Output = Result<T, Problem>>,
    {
        let started = Instant::now();
        let made = self.calls.fetch_add(1, Ordering::SeqCst);
        let (outcome, result) = if made >= self.policy.max_calls {
            let quota = self.policy.max_calls;
            (
                ToolOutcome::Refused,
                Err(format!(
                    "refused: this turn already made {quota} tool calls"
                )),
            )
        } else if self.turn.is_expired() {
            (
                ToolOutcome::Refused,
                Err("refused: nothing is left of the turn's budget".to_owned()),
            )
        } else {
            let deadline = self.turn.child(self.policy.per_tool);
            let budget = deadline.budget();
            tokio::select! {
                // Dropping `run` drops the tool's HTTP request and SQL future.
                () = cancel.cancelled() => (ToolOutcome::Cancelled, Err("cancelled by the caller".to_owned())),
                ran = deadline.run(Stage::Tool, tool(deadline.clone())) => match ran {
                    Ok(Ok(value)) => (ToolOutcome::Ok, Ok(value)),
                    Ok(Err(problem)) if problem.status().as_u16() == 504 => {
                        (ToolOutcome::Timeout, Err(problem.detail().to_owned()))
                    }
                    Ok(Err(problem)) => (ToolOutcome::Error, Err(problem.detail().to_owned())),
                    Err(_) => (ToolOutcome::Timeout, Err(format!("timed out after its {} ms budget", budget.as_millis()))),
                },
            }
        };
        if let Some(observer) = &self.observer {
            observer(name, outcome);
        }
        let (result, error) = match result {
            Ok(value) => (Some(value), None),
            Err(error) => (None, Some(error)),
        };
        ToolCall {
            tool: name.to_owned(),
            outcome,
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            result,
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    async fn slow(deadline: Deadline, ms: u64) -> Result<u64, Problem> {
        deadline
            .run(Stage::named("catalog"), tokio::time::sleep(MS(ms)))
            .await?;
        Ok(ms)
    }

    #[tokio::test(start_paused = true)]
    async fn each_tool_is_cut_at_its_cap_and_the_turn_at_its_budget() {
        let request = Deadline::after(MS(5000));
        let budget = ToolBudget::for_turn(&request, ToolPolicy::default());
        let never = CancellationToken::new();
        let started = Instant::now();
        let mut ends = Vec::new();
        for _ in 0..3 {
            let call = budget.call("slow", &never, |d| slow(d, 2000)).await;
            assert_eq!(call.outcome, ToolOutcome::Timeout);
            ends.push(started.elapsed());
        }
        assert_eq!(ends, vec![MS(800), MS(1600), MS(2000)]);
        let fourth = budget.call("slow", &never, |d| slow(d, 1)).await;
        assert_eq!(fourth.outcome, ToolOutcome::Refused);
        assert_eq!(started.elapsed(), MS(2000), "a refused call does not run");
    }

    #[tokio::test(start_paused = true)]
    async fn the_turn_never_outlives_the_request() {
        let request = Deadline::after(MS(500));
        let budget = ToolBudget::for_turn(&request, ToolPolicy::default());
        assert_eq!(budget.turn().instant(), request.instant());
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_tool_succeeds_and_a_cancelled_one_stops_at_once() {
        let budget = ToolBudget::for_turn(&Deadline::after(MS(5000)), ToolPolicy::default());
        let cancel = CancellationToken::new();
        let ok = budget.call("fast", &cancel, |d| slow(d, 10)).await;
        assert_eq!((ok.outcome, ok.result), (ToolOutcome::Ok, Some(10)));

        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(MS(100)).await;
            trigger.cancel();
        });
        let started = Instant::now();
        let cancelled = budget.call("slow", &cancel, |d| slow(d, 700)).await;
        assert_eq!(cancelled.outcome, ToolOutcome::Cancelled);
        assert_eq!(started.elapsed(), MS(100));
    }
}
