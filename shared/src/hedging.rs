//! [`Hedging`]: a backup attempt for a call that is slow by bad luck, timed from a
//! history of call times, as its [`HedgePolicy`] says. A [`Plugin`] of the budgeted
//! client.
//!
//! # Why hedge
//!
//! Most slow calls are not slow because the downstream is: one call in a hundred meets a
//! pause, a cold cache or a lost packet, and a second try would answer at once. Sending
//! that second try only when the first has taken longer than almost every call does
//! (Dean and Barroso, "The Tail at Scale") cuts the tail for a small share of extra
//! calls: the delay is the quantile `1 − max_extra_load` of recent call times, so with
//! `max_extra_load` 1 % the hedge goes out at the p99 and about 1 % of calls get one.
//!
//! # When not to
//!
//! A hedge is an extra attempt: it is sent only when the call is safe to send twice
//! (`GET`, `HEAD`, or a request marked idempotent), when what is left of the deadline
//! covers what nine attempts in ten take (a hedge with less would too often be cut at
//! the deadline, and the work it asks for thrown away), when the retry budget has a token (so an outage never doubles
//! the load), and when a slot is free at once (a hedge that waits for a slot adds to the
//! queue it is meant to get round). Each refusal is counted. The first good answer
//! wins; the other attempt is dropped, and the downstream sees its caller go away.
//!
//! # The history
//!
//! The delay needs a high quantile, and a high quantile needs many calls: the p99 of
//! admission's 64 recent calls is their maximum. So the client keeps, beside
//! admission's short memory, a longer one: every attempt's time in a histogram with
//! buckets a sixteenth of a doubling wide (4.4 % resolution), over the last ten seconds in
//! one-second slices. A call cut at its deadline (or dropped because its hedge won) is
//! censored, as admission counts it: the quantiles are Kaplan–Meier's, so a cut call
//! never makes the downstream look quicker than it is. When more calls are stragglers
//! than `max_extra_load` (a straggler cut or dropped says only that it took longer),
//! the quantile lies beyond every call that finished; the hedge then goes out after that
//! quantile of the calls that finished, and the retry budget bounds the extra load.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Event, Plugin};

/// How a client hedges its calls to one downstream.
///
/// ```
/// use deadline_propagation::hedging::HedgePolicy;
///
/// // A hedge at the p95 of recent calls, never sooner than 5 ms, once 100 calls are known.
/// let mut hedge = HedgePolicy::default();
/// hedge.max_extra_load = 0.05;
/// assert!(hedge.deadline_aware);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct HedgePolicy {
    /// The share of extra calls hedging may add: the hedge is sent after the quantile
    /// `1 − max_extra_load` of recent call times (0.01: the p99).
    pub max_extra_load: f64,
    /// The shortest delay, however quick calls are: below it a hedge would only double
    /// calls that were about to answer.
    pub min_delay: Duration,
    /// Calls the history must hold before any hedge (a quantile of a few calls is noise).
    pub min_samples: u32,
    /// Send an extra attempt only when what is left covers what nine attempts in ten
    /// take (the history's p90). Off only to measure what the rule is worth.
    pub deadline_aware: bool,
}

impl Default for HedgePolicy {
    /// The p99, at least 5 ms, after 100 calls, deadline-aware.
    fn default() -> Self {
        Self {
            max_extra_load: 0.01,
            min_delay: Duration::from_millis(5),
            min_samples: 100,
            deadline_aware: true,
        }
    }
}

/// Buckets per doubling of the call time: 4.4 % wide, so a delay taken from a bucket's
/// upper bound is at most that much late.
const PER_OCTAVE: f64 = 16.0;
/// Buckets in all: from 1 µs to about 2^25 µs (33 s), the last one open.
const BUCKETS: usize = 25 * PER_OCTAVE as usize + 1;
/// The history's slices, and how long each covers: ten seconds in all.
const SLICES: usize = 10;
const SLICE: Duration = Duration::from_secs(1);

/// The bucket of a call time.
fn bucket(took: Duration) -> usize {
    let micros = took.as_micros().max(1) as f64;
    ((micros.log2() * PER_OCTAVE) as usize).min(BUCKETS - 1)
}

/// The longest call time in bucket `b` (its upper bound).
fn upper(b: usize) -> Duration {
    Duration::from_secs_f64(((b + 1) as f64 / PER_OCTAVE).exp2() / 1e6)
}

/// Counts of finished and cut attempts per bucket.
#[derive(Clone, Debug)]
struct Counts {
    finished: [u32; BUCKETS],
    cut: [u32; BUCKETS],
    calls: u32,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            finished: [0; BUCKETS],
            cut: [0; BUCKETS],
            calls: 0,
        }
    }
}

impl Counts {
    /// The Kaplan–Meier `quantile`: the first bucket's upper bound by which that share
    /// has finished; `None` when the finished calls never reach it.
    fn quantile(&self, quantile: f64) -> Option<Duration> {
        let mut at_risk = f64::from(self.calls);
        let mut still_running = 1.0;
        for b in 0..BUCKETS {
            let finished = f64::from(self.finished[b]);
            if finished > 0.0 {
                still_running *= 1.0 - finished / at_risk;
                if 1.0 - still_running >= quantile - 1e-12 {
                    return Some(upper(b));
                }
            }
            at_risk -= finished + f64::from(self.cut[b]);
        }
        None
    }

    /// The `quantile` of the finished calls alone: what a call that answers as usual
    /// takes, whatever became of the others.
    fn finished_quantile(&self, quantile: f64) -> Option<Duration> {
        let finished: u32 = self.finished.iter().sum();
        let mut seen = 0.0;
        for b in 0..BUCKETS {
            seen += f64::from(self.finished[b]);
            if finished > 0 && seen >= quantile * f64::from(finished) - 1e-9 {
                return Some(upper(b));
            }
        }
        None
    }

    /// The `quantile`, or, when more calls were cut than it leaves room for (the
    /// stragglers cut or dropped), that quantile of the calls that finished: by then
    /// almost every call that answers as usual has. (The slowest finished call would
    /// do too, but one call slowed by a busy machine would set it.)
    fn quantile_or_finished(&self, quantile: f64) -> Option<Duration> {
        self.quantile(quantile)
            .or_else(|| self.finished_quantile(quantile))
    }
}

#[derive(Debug)]
struct Slices {
    /// The newest slice is `slices[current]`; each began at `began[i]`.
    slices: Vec<Counts>,
    began: Vec<Instant>,
    current: usize,
    /// The sum of every slice.
    total: Counts,
}

impl Slices {
    fn starting(now: Instant) -> Self {
        Self {
            slices: vec![Counts::default(); SLICES],
            began: vec![now; SLICES],
            current: 0,
            total: Counts::default(),
        }
    }
}

/// The share of attempts that must finish in what is left for an extra attempt to be
/// sent: nine in ten (the median, first tried, left half the borderline ones cut).
const LIKELY: f64 = 0.9;

/// The call times of the last ten seconds, and the two figures read from them on every
/// call: the hedge's delay and the time an attempt is likely to finish in.
///
/// ```
/// use deadline_propagation::hedging::{HedgePolicy, Hedging};
/// use deadline_propagation::client::{BudgetedClient, ClientConfig};
/// use deadline_propagation::Downstream;
///
/// let config = ClientConfig::new(Downstream::new("inventory").unwrap(), "http://127.0.0.1:8082");
/// let client = BudgetedClient::new(config).unwrap().plugin(Hedging::new(HedgePolicy::default()));
/// ```
#[derive(Debug)]
pub struct Hedging {
    policy: HedgePolicy,
    slices: Mutex<Slices>,
    /// 0 while there is no delay (too few calls, or a quantile beyond what was seen).
    delay_nanos: AtomicU64,
    likely_nanos: AtomicU64,
}

impl Plugin for Hedging {
    fn hedge_after(&self) -> Option<Duration> {
        self.delay()
    }

    fn likely_attempt(&self) -> Option<Duration> {
        self.likely()
    }

    fn deadline_rule(&self) -> bool {
        self.policy.deadline_aware
    }

    fn on_event(&self, event: &Event) {
        if let Event::Attempt(attempt) = event
            && attempt.learns
        {
            self.record(attempt.took, attempt.censored);
        }
    }

    fn readings(&self) -> Vec<(&'static str, Duration)> {
        vec![("hedge_delay", self.delay().unwrap_or_default())]
    }
}

impl Hedging {
    /// Hedging as `policy` says, with no history yet.
    pub fn new(policy: HedgePolicy) -> Self {
        Self {
            policy,
            slices: Mutex::new(Slices::starting(Instant::now())),
            delay_nanos: AtomicU64::new(0),
            likely_nanos: AtomicU64::new(0),
        }
    }

    /// Records an attempt that ran for `took`; `cut` when it was cut then (at the
    /// deadline, or dropped for its hedge): it would have taken at least `took`.
    fn record(&self, took: Duration, cut: bool) {
        let mut s = self.slices.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // After a quiet spell longer than the window, nothing in it is recent.
        if now.saturating_duration_since(s.began[s.current]) >= SLICE * SLICES as u32 {
            *s = Slices::starting(now);
        }
        // Moves on to a new slice once the current one has covered its second, dropping
        // the oldest slice from the total.
        while now.saturating_duration_since(s.began[s.current]) >= SLICE {
            let next = (s.current + 1) % SLICES;
            let old = std::mem::take(&mut s.slices[next]);
            for b in 0..BUCKETS {
                s.total.finished[b] -= old.finished[b];
                s.total.cut[b] -= old.cut[b];
            }
            s.total.calls -= old.calls;
            s.began[next] = s.began[s.current] + SLICE;
            s.current = next;
        }
        let (b, current) = (bucket(took), s.current);
        let slot = if cut {
            &mut s.slices[current].cut[b]
        } else {
            &mut s.slices[current].finished[b]
        };
        *slot += 1;
        s.slices[current].calls += 1;
        if cut {
            s.total.cut[b] += 1;
        } else {
            s.total.finished[b] += 1;
        }
        s.total.calls += 1;
        let enough = s.total.calls >= self.policy.min_samples;
        let delay = enough
            .then(|| {
                s.total
                    .quantile_or_finished(1.0 - self.policy.max_extra_load)
            })
            .flatten()
            .map(|d| d.max(self.policy.min_delay));
        let likely = s.total.quantile_or_finished(LIKELY);
        drop(s);
        self.delay_nanos.store(nanos(delay), Ordering::Relaxed);
        self.likely_nanos.store(nanos(likely), Ordering::Relaxed);
    }

    /// How long the first attempt may run before a hedge goes out; `None` before
    /// [`HedgePolicy::min_samples`] calls, or before any finished.
    fn delay(&self) -> Option<Duration> {
        duration(self.delay_nanos.load(Ordering::Relaxed))
    }

    /// The time nine attempts in ten finish in ([`LIKELY`]); `None` until one is known.
    fn likely(&self) -> Option<Duration> {
        duration(self.likely_nanos.load(Ordering::Relaxed))
    }
}

fn nanos(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| {
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
    })
}

fn duration(nanos: u64) -> Option<Duration> {
    (nanos > 0).then(|| Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn buckets_are_a_sixteenth_of_a_doubling_wide_and_bound_their_calls() {
        for ms in [1, 7, 10, 30, 999, 1000, 60_000] {
            let took = MS(ms);
            let b = bucket(took);
            assert!(upper(b) >= took || b == BUCKETS - 1, "{ms} ms in {b}");
            assert!(upper(b).as_secs_f64() <= took.as_secs_f64() * 1.05 || b == BUCKETS - 1);
        }
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::MAX), BUCKETS - 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_delay_is_the_quantile_once_enough_calls_are_known() {
        let history = Hedging::new(HedgePolicy::default());
        // 10..=30 ms, and one call in a hundred stalls for a second.
        for i in 0..99 {
            assert_eq!(history.delay(), None, "after {i} calls");
            history.record(MS(10 + i % 21), false);
        }
        history.record(MS(1000), false);
        let delay = history.delay().expect("a delay after 100 calls");
        assert!(delay >= MS(30) && delay <= MS(33), "{delay:?}");
        let likely = history.likely().expect("a p90");
        assert!(likely >= MS(27) && likely <= MS(30), "{likely:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_delay_is_never_below_its_floor() {
        let policy = HedgePolicy {
            min_delay: MS(5),
            ..HedgePolicy::default()
        };
        let history = Hedging::new(policy);
        for _ in 0..200 {
            history.record(Duration::from_micros(200), false);
        }
        assert_eq!(history.delay(), Some(MS(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn with_more_stragglers_than_the_quantile_allows_the_hedge_waits_for_the_finished_calls()
    {
        let history = Hedging::new(HedgePolicy::default());
        // One call in twenty is a straggler, dropped at 40 ms for its hedge; the others
        // finish in 10 to 30 ms. The p99 is beyond every call that finished.
        for i in 0..400 {
            let straggler = i % 20 == 0;
            history.record(MS(if straggler { 40 } else { 10 + i % 21 }), straggler);
        }
        let delay = history.delay().expect("a delay");
        assert!(
            delay >= MS(30) && delay <= MS(33),
            "the finished calls' p99: {delay:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_finished_call_means_no_delay() {
        let history = Hedging::new(HedgePolicy::default());
        for _ in 0..200 {
            history.record(MS(20), true);
        }
        assert_eq!(history.delay(), None);
        assert_eq!(history.likely(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_older_than_ten_seconds_are_forgotten() {
        let history = Hedging::new(HedgePolicy::default());
        for _ in 0..200 {
            history.record(MS(500), false);
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        for _ in 0..100 {
            history.record(MS(10), false);
        }
        let delay = history.delay().expect("a delay");
        assert!(
            delay <= MS(11),
            "the slow calls of 11 s ago still count: {delay:?}"
        );
        // A quiet spell longer than the window leaves nothing behind either.
        tokio::time::advance(Duration::from_secs(60)).await;
        history.record(MS(10), false);
        assert_eq!(history.delay(), None, "one call is not enough");
    }
}
