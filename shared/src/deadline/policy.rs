//! [`DeadlinePolicy`]: the clamp every ingress applies to a client's budget.

use std::time::Duration;

/// How an ingress turns a client's requested budget into an accepted one.
///
/// Its fields are private so that no policy can exist whose default exceeds its
/// maximum, or whose maximum is zero: [`new`](Self::new) clamps both.
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

    /// The most this service ever grants, whatever the client asks for. Without it a
    /// client asking for 60 s would hold a worker, a pool slot and a database
    /// connection for 60 s.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The budget of a request that sends no budget header.
    pub fn default_budget(&self) -> Duration {
        self.default
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
