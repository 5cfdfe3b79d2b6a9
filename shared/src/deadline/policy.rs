//! [`DeadlinePolicy`]: the clamp every ingress applies to a client's budget.

use std::time::Duration;

/// How an ingress turns a client's requested budget into an accepted one.
///
/// ```
/// use std::time::Duration;
/// use shared::DeadlinePolicy;
///
/// // DEADLINE_MAX_MS=2000, DEADLINE_DEFAULT_MS=1000
/// let policy = DeadlinePolicy::from_millis(2000, 1000);
/// assert_eq!(policy.accept(Some(Duration::from_secs(60))), (Duration::from_millis(2000), true));
/// assert_eq!(policy.accept(None), (Duration::from_millis(1000), false));
/// ```
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
    ///
    /// ```
    /// use std::time::Duration;
    /// use shared::DeadlinePolicy;
    ///
    /// assert_eq!(DeadlinePolicy::MIN, Duration::from_millis(1));
    /// ```
    pub const MIN: Duration = Duration::from_millis(1);

    /// A policy; `default` is itself clamped to `max`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use shared::DeadlinePolicy;
    /// // A default above the maximum is brought down to it.
    /// let policy = DeadlinePolicy::new(Duration::from_millis(500), Duration::from_secs(5));
    /// assert_eq!(policy.default, Duration::from_millis(500));
    /// ```
    pub fn new(max: Duration, default: Duration) -> Self {
        let max = max.max(Self::MIN);
        Self {
            max,
            default: default.clamp(Self::MIN, max),
        }
    }

    /// A policy from whole milliseconds, as configuration gives them.
    ///
    /// ```
    /// # use shared::DeadlinePolicy;
    /// let policy = DeadlinePolicy::from_millis(2000, 1000);
    /// assert_eq!(policy.max.as_millis(), 2000);
    /// ```
    pub fn from_millis(max_ms: u64, default_ms: u64) -> Self {
        Self::new(
            Duration::from_millis(max_ms),
            Duration::from_millis(default_ms),
        )
    }

    /// The budget to accept: `clamp(requested, 1 ms, max)`, or the default when absent.
    /// The flag says whether the request was clamped, which is counted.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use shared::DeadlinePolicy;
    /// let policy = DeadlinePolicy::from_millis(2000, 1000);
    /// // A zero budget still gets the minimum, and is counted as clamped.
    /// assert_eq!(policy.accept(Some(Duration::ZERO)), (DeadlinePolicy::MIN, true));
    /// ```
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
