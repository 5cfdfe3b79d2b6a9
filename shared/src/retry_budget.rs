//! [`RetryBudget`]: how many extra attempts (hedges and retries) a client may send, as a
//! share of its first attempts; [`RetryTokens`], the [`Plugin`] that spends it.
//!
//! An extra attempt is cheap when the downstream is well and costly when it is not: a
//! downstream that fails everything gets every call twice if each failure is retried,
//! just when it can least afford it. So extra attempts spend tokens that only first
//! attempts earn: each first attempt deposits [`ratio`](RetryBudget::ratio) of a
//! token, a small [`floor_per_s`](RetryBudget::floor_per_s) trickles in with time (so a
//! client with little traffic can still retry now and then), and the bucket holds at
//! most [`cap`](RetryBudget::cap). During an outage the downstream gets at most `1 +
//! ratio` calls per first attempt, plus the floor and what the bucket held: Finagle's
//! `RetryBudget` and Linkerd's `retryRatio` work the same way (20 % and 10 a second by
//! default); this crate's default is 3 % and one every two seconds.

use std::sync::Mutex;

use tokio::time::Instant;

use crate::client::{Event, Plugin};

/// The budget of extra attempts of one downstream's client.
///
/// ```
/// use deadline_propagation::retry_budget::RetryBudget;
///
/// // At most one extra attempt per 20 first attempts, and one every second anyway.
/// let mut budget = RetryBudget::default();
/// budget.ratio = 0.05;
/// budget.floor_per_s = 1.0;
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct RetryBudget {
    /// Tokens each first attempt earns (0.03: 3 extra attempts per 100 first ones).
    pub ratio: f64,
    /// Tokens earned per second whatever the traffic.
    pub floor_per_s: f64,
    /// The most tokens the bucket holds (what a burst of failures may spend at once).
    pub cap: f64,
}

impl Default for RetryBudget {
    /// 3 % of first attempts, one every two seconds, at most 5 at once: during an outage
    /// of 10 s at 100 calls a second, 1.04 calls per call.
    fn default() -> Self {
        Self {
            ratio: 0.03,
            floor_per_s: 0.5,
            cap: 5.0,
        }
    }
}

/// The bucket of one client: its tokens and when the floor last trickled in.
///
/// ```
/// use deadline_propagation::retry_budget::{RetryBudget, RetryTokens};
/// use deadline_propagation::client::{BudgetedClient, ClientConfig};
/// use deadline_propagation::Downstream;
///
/// let config = ClientConfig::new(Downstream::new("inventory").unwrap(), "http://127.0.0.1:8082");
/// let client = BudgetedClient::new(config).unwrap().plugin(RetryTokens::new(RetryBudget::default()));
/// ```
#[derive(Debug)]
pub struct RetryTokens {
    budget: RetryBudget,
    state: Mutex<(f64, Instant)>,
}

impl Plugin for RetryTokens {
    fn allow_extra(&self) -> bool {
        self.withdraw()
    }

    fn on_event(&self, event: &Event) {
        if let Event::Call = event {
            self.deposit();
        }
    }
}

impl RetryTokens {
    /// A full bucket: a client that has just started may retry a refused first call.
    pub fn new(budget: RetryBudget) -> Self {
        Self {
            budget,
            state: Mutex::new((budget.cap, Instant::now())),
        }
    }

    /// A first attempt was sent: it earns its share.
    fn deposit(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = (state.0 + self.budget.ratio).min(self.budget.cap);
    }

    /// Takes a token for an extra attempt; `false` when there is none.
    fn withdraw(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let trickled =
            now.saturating_duration_since(state.1).as_secs_f64() * self.budget.floor_per_s;
        state.0 = (state.0 + trickled).min(self.budget.cap);
        state.1 = now;
        if state.0 >= 1.0 {
            state.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// Tokens held now (for tests).
    #[cfg(test)]
    fn held(&self) -> f64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// How long a steady outage of `length` at `rate` first attempts a second may cost in
    /// extra attempts at most, as calls per first attempt: the bound the defaults are
    /// chosen for.
    fn worst_calls_per_call(budget: RetryBudget, rate: f64, length: Duration) -> f64 {
        let firsts = rate * length.as_secs_f64();
        let extra = budget.ratio * firsts + budget.floor_per_s * length.as_secs_f64() + budget.cap;
        1.0 + extra / firsts
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[tokio::test(start_paused = true)]
    async fn a_failing_downstream_gets_at_most_the_ratio_the_floor_and_the_cap_again() {
        let budget = RetryBudget::default();
        let tokens = RetryTokens::new(budget);
        // 100 first attempts a second for 10 s, each failing and asking for a retry.
        let (mut firsts, mut extras) = (0, 0);
        for _ in 0..1000 {
            tokio::time::advance(MS(10)).await;
            tokens.deposit();
            firsts += 1;
            if tokens.withdraw() {
                extras += 1;
            }
        }
        let per_call = f64::from(firsts + extras) / f64::from(firsts);
        assert!(per_call <= 1.05, "{per_call:.3} calls per call");
        assert!(
            per_call <= worst_calls_per_call(budget, 100.0, Duration::from_secs(10)) + 1e-9,
            "{per_call}"
        );
        assert!(extras >= 30, "the ratio still lets some through: {extras}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_lets_a_quiet_client_retry_now_and_then() {
        let tokens = RetryTokens::new(RetryBudget {
            ratio: 0.0,
            floor_per_s: 0.5,
            cap: 1.0,
        });
        assert!(tokens.withdraw(), "a full bucket to begin with");
        assert!(!tokens.withdraw());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!tokens.withdraw(), "half a token after a second");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(tokens.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_never_holds_more_than_its_cap() {
        let tokens = RetryTokens::new(RetryBudget::default());
        for _ in 0..10_000 {
            tokens.deposit();
        }
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(tokens.withdraw());
        assert!(tokens.held() <= RetryBudget::default().cap - 1.0 + 1e-9);
    }
}
