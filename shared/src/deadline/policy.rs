//! [`DeadlinePolicy`]: the clamp every ingress applies to a client's budget.

use std::time::Duration;

/// How an ingress turns a client's requested budget into an accepted one. No policy
/// has a default above its maximum or a zero maximum: [`new`](Self::new) clamps both.
///
/// ```
/// use std::time::Duration;
/// use deadline_propagation::DeadlinePolicy;
///
/// let policy = DeadlinePolicy::from_millis(2000, 5000); // a default above the maximum
/// assert_eq!(policy.default_budget(), Duration::from_millis(2000));
/// assert_eq!(policy.accept(Some(Duration::from_secs(60))), (Duration::from_secs(2), true));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadlinePolicy {
    max: Duration,
    default: Duration,
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

    /// The most this service grants: a client asking for 60 s would otherwise hold a
    /// worker, a pool slot and a connection for 60 s.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The budget of a request that sends no budget header.
    pub fn default_budget(&self) -> Duration {
        self.default
    }

    /// `clamp(requested, 1 ms, max)`, or the default when absent; and whether it was
    /// clamped (which is counted).
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
