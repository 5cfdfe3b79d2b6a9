//! [`Admission`]: refuse a call that the recent latency says cannot finish in time,
//! before it takes a slot.
//!
//! A deadline stops a call when its budget runs out; it does not stop the call from
//! *starting*. With 1 s of downstream latency and a 700 ms budget every call is sent,
//! holds a slot for the whole budget and ends in a 504: the downstream spends its
//! capacity on answers nobody reads, and the caller waits its whole budget for a no.
//! Admission compares what a call has left with what calls like it took recently, and
//! refuses the doomed ones at once (503, `Retry-After`).
//!
//! # The estimate
//!
//! What a call started *now* will take is best told by the calls started most recently.
//! The estimate is a weighted quantile of the last [`WINDOW`] call times, each weighted by
//! how recently its call *started* (halving every [`HALF_LIFE`]). Weighting by start,
//! not by completion, is what makes recovery quick: when the downstream gets fast, the
//! slow calls started before that still complete for a while, but they started earlier
//! than the first fast call, so they count for little next to it.
//!
//! The quantile is a *low* one ([`MIN_SUCCESS_CHANCE`], 10 %): a call is refused only
//! when fewer than one in ten recent calls were as quick as it would need to be. A
//! high quantile would refuse calls that have a good chance: with a catalog answering in
//! 200 to 800 ms and a 700 ms budget, 80 % of calls succeed, and refusing them all
//! because the p90 is 740 ms would throw that goodput away. Refusing only calls with a
//! small chance costs nothing where calls might succeed, and still refuses everything
//! when the downstream is slower than every budget.
//!
//! # Censored calls
//!
//! A call cut at its deadline says only that the downstream took *at least* that long.
//! Dropping such calls would leave a downstream slower than every budget unlearned
//! forever; counting them at the time they were cut would put the estimate exactly at
//! the budget of the next caller like them, who would be admitted and cut again. So a
//! cut call counts as [`CENSORED_FACTOR`] times its budget: longer than it could wait,
//! by a margin that callers with much more budget can still afford.
//!
//! A cut call is cut by the *caller's* budget, which may have nothing to do with the
//! downstream: a caller deep in a call chain with 20 ms left, cut after 20 ms, says only
//! that a downstream which takes a second took more than 20 ms. Were that sample to
//! pull the estimate down, every caller would be admitted to a downstream that is
//! still slow until their own cut calls came back. So a cut call may raise the
//! estimate but never lower it: it counts as at least the estimate it was recorded
//! under. Only a call that finished can say the downstream got quicker.
//!
//! # Noticing recovery
//!
//! Refused calls produce no samples, so while refusing the estimate would never change.
//! One call per [`PROBE_INTERVAL`] is let through anyway (a *probe*), so the estimate
//! keeps following the downstream and admission reopens within about one interval of
//! the downstream getting fast. At 4 probes a second, a downstream that gets 70 calls a
//! second without admission gets about 6 % of them with it.
//!
//! The probe goes to a call with enough budget to learn something: at least
//! 1/[`MIN_PROBE_SHARE`] of the estimate. Callers like the ones that were cut have about
//! half the estimate (a cut call counts twice its budget), so they qualify with room to
//! spare; a caller with a few ms left does not, since it would be cut long before a slow
//! downstream answered. If no such call comes for [`PROBE_STARVED_AFTER`], any refused
//! call may probe: when only short callers are left, one of them must find out that the
//! downstream got quick, and cut, it cannot lower the estimate anyway.
//!
//! The pool wait is added per call: a call that must queue for a slot needs the wait
//! on top of the call itself (see [`expected_wait`]).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics::FloatGauge;
use tokio::time::Instant;

/// Recent calls the estimate is taken from.
pub(crate) const WINDOW: usize = 64;
/// A call's weight halves for every this much earlier it started than the newest.
pub(crate) const HALF_LIFE: Duration = Duration::from_millis(250);
/// A call is refused when fewer than this share of recent calls were quick enough.
pub(crate) const MIN_SUCCESS_CHANCE: f64 = 0.1;
/// A call cut at its deadline counts as this many times the budget it had.
pub(crate) const CENSORED_FACTOR: u32 = 2;
/// While refusing, one call per interval goes through as a probe.
#[doc(hidden)]
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// A probe needs at least this fraction (1/N) of the estimate to spend.
pub(crate) const MIN_PROBE_SHARE: u32 = 4;
/// How long a due probe waits for a call with enough budget before any call may take it.
pub(crate) const PROBE_STARVED_AFTER: Duration = Duration::from_secs(1);

/// Whether the budgeted client predicts (`CATALOG_ADMISSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum AdmissionMode {
    /// Refuse calls predicted to finish late.
    #[default]
    Predict,
    /// Admit every call (the pool limits still apply).
    Off,
}

/// What to do with one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Enough budget for what calls like it took.
    Admit,
    /// Predicted late, but sent to learn whether the downstream is quick again.
    Probe,
    /// Predicted late: `needed` (pool wait + call) is more than the call has.
    Refuse {
        /// What the call would need.
        needed: Duration,
    },
}

/// One finished call: when it started and how long it took (or counts as taking).
#[derive(Clone, Copy, Debug)]
struct Sample {
    started: Instant,
    took: Duration,
}

/// The latency estimate and probe clock of one downstream. Share it behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Admission {
    samples: Mutex<VecDeque<Sample>>,
    /// The current estimate in nanoseconds: read on every call without the lock.
    estimate_nanos: AtomicU64,
    /// Nanoseconds after `origin` before which no further probe goes out.
    next_probe: AtomicU64,
    origin: Instant,
    gauge: FloatGauge,
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(FloatGauge::default())
    }
}

impl Admission {
    /// An admission with no history (it admits everything until calls are recorded);
    /// `gauge` shows the estimate (`http_client_latency_estimate_seconds`).
    pub(crate) fn new(gauge: FloatGauge) -> Self {
        Self {
            samples: Mutex::new(VecDeque::with_capacity(WINDOW + 1)),
            estimate_nanos: AtomicU64::new(0),
            next_probe: AtomicU64::new(0),
            origin: Instant::now(),
            gauge,
        }
    }

    /// What a call started now is expected to take (pool wait not included).
    pub(crate) fn estimate(&self) -> Duration {
        Duration::from_nanos(self.estimate_nanos.load(Ordering::Relaxed))
    }

    /// The verdict for a call with `available` to spend after waiting `wait` for a slot.
    /// `may_probe: false` (observe mode) asks only what the verdict would be, and uses
    /// up no probe.
    pub(crate) fn check(&self, available: Duration, wait: Duration, may_probe: bool) -> Verdict {
        let estimate = self.estimate();
        let needed = estimate + wait;
        if available >= needed {
            Verdict::Admit
        } else if may_probe && self.take_probe(available >= estimate / MIN_PROBE_SHARE) {
            Verdict::Probe
        } else {
            Verdict::Refuse { needed }
        }
    }

    /// Records a finished call that started at `started` and took `took`; `censored`
    /// when it was cut at its deadline (it would have taken at least `took`). A censored
    /// call never lowers the estimate (see the module's "Censored calls").
    pub(crate) fn record(&self, started: Instant, took: Duration, censored: bool) {
        let mut samples = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Read under the lock: two cut calls recorded at once must not both compare
        // against an estimate the other is about to replace.
        let before = self.estimate();
        let took = if censored {
            took.saturating_mul(CENSORED_FACTOR).max(before)
        } else {
            took
        };
        samples.push_back(Sample { started, took });
        if samples.len() > WINDOW {
            samples.pop_front();
        }
        let quantile = weighted_quantile(&samples, MIN_SUCCESS_CHANCE);
        // Kept in the window at no less than the estimate, a cut call cannot pull a
        // later estimate down either; the window's oldest call leaving could, so the
        // estimate is held here too.
        let estimate = if censored {
            quantile.max(before)
        } else {
            quantile
        };
        self.estimate_nanos.store(
            u64::try_from(estimate.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.gauge.set(estimate.as_secs_f64());
    }

    /// Takes the probe of the current interval, if nobody has yet: at once for a call
    /// that can learn something (`informative`), else only once the probe has waited
    /// [`PROBE_STARVED_AFTER`] for one that can.
    fn take_probe(&self, informative: bool) -> bool {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let now = nanos(self.origin.elapsed());
        let next = now.saturating_add(nanos(PROBE_INTERVAL));
        let patience = if informative {
            0
        } else {
            nanos(PROBE_STARVED_AFTER)
        };
        self.next_probe
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |due| {
                (now >= due.saturating_add(patience)).then_some(next)
            })
            .is_ok()
    }
}

/// The `quantile` of the call times, each weighted by how recently its call started.
fn weighted_quantile(samples: &VecDeque<Sample>, quantile: f64) -> Duration {
    let Some(newest) = samples.iter().map(|s| s.started).max() else {
        return Duration::ZERO;
    };
    let mut weighted: Vec<(Duration, f64)> = samples
        .iter()
        .map(|s| {
            let age = newest.duration_since(s.started).as_secs_f64();
            (s.took, (-age / HALF_LIFE.as_secs_f64()).exp2())
        })
        .collect();
    weighted.sort_by_key(|&(took, _)| took);
    let total: f64 = weighted.iter().map(|&(_, w)| w).sum();
    let mut seen = 0.0;
    for &(took, weight) in &weighted {
        seen += weight;
        if seen >= quantile * total {
            return took;
        }
    }
    weighted.last().map_or(Duration::ZERO, |&(took, _)| took)
}

/// How long a call is expected to wait for a slot: nothing while one is free; else its
/// place in the queue times how often a slot frees up (`estimate / max_in_flight`),
/// never more than the pool's own acquire limit.
pub(crate) fn expected_wait(
    active: usize,
    max_in_flight: usize,
    pending: usize,
    estimate: Duration,
    limit: Duration,
) -> Duration {
    if active < max_in_flight {
        return Duration::ZERO;
    }
    let place = u32::try_from(pending + 1).unwrap_or(u32::MAX);
    let per_slot = estimate / u32::try_from(max_in_flight.max(1)).unwrap_or(u32::MAX);
    per_slot.saturating_mul(place).min(limit)
}

#[cfg(test)]
mod tests {
    // Admission under paused time: a simulated downstream, one arrival every 10 ms.

    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;
    /// What each simulated call has to spend (a 700 ms budget, minus the hop's reserve).
    const BUDGET: Duration = Duration::from_millis(695);
    const TICK: Duration = Duration::from_millis(10);

    /// Calls sent and not finished: (finishes at, started, took, cut at its deadline).
    struct Sim {
        admission: Admission,
        in_flight: Vec<(Instant, Instant, Duration, bool)>,
        arrivals: usize,
        sent: usize,
        refused: usize,
        first_admitted_after: Option<Instant>,
    }

    impl Sim {
        fn new() -> Self {
            Self {
                admission: Admission::default(),
                in_flight: Vec::new(),
                arrivals: 0,
                sent: 0,
                refused: 0,
                first_admitted_after: None,
            }
        }

        /// Runs arrivals for `period` against a downstream taking `latency(i)` for the i-th
        /// call; calls longer than the budget are cut at it.
        async fn run(&mut self, period: Duration, latency: impl Fn(usize) -> Duration) {
            self.run_with(period, |_| BUDGET, latency).await;
        }

        /// Like [`run`](Self::run), the i-th arrival having `budget(i)` to spend.
        async fn run_with(
            &mut self,
            period: Duration,
            budget: impl Fn(usize) -> Duration,
            latency: impl Fn(usize) -> Duration,
        ) {
            let end = Instant::now() + period;
            while Instant::now() < end {
                tokio::time::advance(TICK).await;
                let now = Instant::now();
                self.in_flight.retain(|&(done, started, took, cut)| {
                    let finished = done <= now;
                    if finished {
                        self.admission.record(started, took, cut);
                    }
                    !finished
                });
                let budget = budget(self.arrivals);
                self.arrivals += 1;
                match self.admission.check(budget, Duration::ZERO, true) {
                    Verdict::Refuse { .. } => self.refused += 1,
                    verdict => {
                        if verdict == Verdict::Admit && self.first_admitted_after.is_none() {
                            self.first_admitted_after = Some(now);
                        }
                        let took = latency(self.sent);
                        let (took, cut) = if took > budget {
                            (budget, true)
                        } else {
                            (took, false)
                        };
                        self.in_flight.push((now + took, now, took, cut));
                        self.sent += 1;
                    }
                }
            }
        }

        fn reset_counts(&mut self) {
            self.sent = 0;
            self.refused = 0;
            self.first_admitted_after = None;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_downstream_is_never_refused() {
        let mut sim = Sim::new();
        // Mostly 5 ms, one call in twenty takes 400 ms: a healthy downstream with a tail.
        sim.run(Duration::from_secs(20), |i| {
            if i % 20 == 0 { MS(400) } else { MS(5) }
        })
        .await;
        assert_eq!(sim.refused, 0);
        assert_eq!(sim.sent, 2000);
        assert!(
            sim.admission.estimate() < MS(50),
            "{:?}",
            sim.admission.estimate()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_downstream_slower_than_every_budget_is_learned_from_cut_calls_and_refused() {
        let mut sim = Sim::new();
        sim.run(Duration::from_secs(1), |_| MS(5)).await;
        // Every call is now cut at its deadline: only censored samples arrive.
        sim.run(Duration::from_millis(1500), |_| MS(1000)).await;
        assert!(
            sim.admission.estimate() > BUDGET,
            "learned from cut calls: {:?}",
            sim.admission.estimate()
        );
        sim.reset_counts();
        sim.run(Duration::from_secs(10), |_| MS(1000)).await;
        // 1000 arrivals; without admission every one would be sent.
        assert!(sim.sent <= 100, "sent {} of 1000", sim.sent);
        assert_eq!(sim.first_admitted_after, None, "only probes went out");
    }

    #[tokio::test(start_paused = true)]
    async fn while_refusing_probes_go_out_at_the_bounded_rate() {
        let mut sim = Sim::new();
        sim.run(Duration::from_secs(3), |_| MS(1000)).await;
        sim.reset_counts();
        sim.run(Duration::from_secs(5), |_| MS(1000)).await;
        let expected = (Duration::from_secs(5).as_millis() / PROBE_INTERVAL.as_millis()) as usize;
        assert!(
            (expected - 1..=expected + 1).contains(&sim.sent),
            "{} probes in 5 s, expected about {expected}",
            sim.sent
        );
    }

    #[tokio::test(start_paused = true)]
    async fn admission_reopens_within_a_second_of_the_downstream_getting_fast() {
        let mut sim = Sim::new();
        sim.run(Duration::from_secs(5), |_| MS(1000)).await;
        assert!(sim.admission.estimate() > BUDGET);
        sim.reset_counts();
        let fast_since = Instant::now();
        sim.run(Duration::from_secs(3), |_| MS(5)).await;
        let reopened = sim.first_admitted_after.expect("admission reopened");
        assert!(
            reopened - fast_since <= Duration::from_secs(1),
            "reopened after {:?}",
            reopened - fast_since
        );
        // Once open it stays open: the slow probes still finishing count for little.
        sim.reset_counts();
        sim.run(Duration::from_secs(2), |_| MS(5)).await;
        assert_eq!(sim.refused, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_downstream_that_is_often_quick_enough_is_not_refused() {
        let mut sim = Sim::new();
        // 200 to 790 ms: about four calls in five finish within the budget.
        sim.run(Duration::from_secs(10), |i| MS(200 + (i as u64 * 37) % 600))
            .await;
        assert_eq!(sim.refused, 0, "a call with a good chance is sent");
    }

    /// Deep in a call chain, callers near the end of their budget are normal. One with a
    /// few ms left must neither take the probe (cut after a few ms, it learns nothing about
    /// a downstream that takes a second) nor, cut, drag the estimate down and let every
    /// caller through to a downstream that is still slow.
    #[tokio::test(start_paused = true)]
    async fn callers_with_a_few_ms_left_do_not_reopen_admission_to_a_slow_downstream() {
        // One arrival in twelve has 20 ms to spend, the others the usual 695 ms.
        let budget = |i: usize| if i.is_multiple_of(12) { MS(20) } else { BUDGET };
        let mut sim = Sim::new();
        sim.run_with(Duration::from_secs(3), budget, |_| MS(1000))
            .await;
        sim.reset_counts();
        let period = Duration::from_secs(25);
        sim.run_with(period, budget, |_| MS(1000)).await;
        let probes = (period.as_millis() / PROBE_INTERVAL.as_millis()) as usize;
        assert!(
            sim.sent <= probes + probes / 10,
            "{} calls sent in {period:?}, about {probes} probes expected",
            sim.sent
        );
        assert_eq!(sim.first_admitted_after, None, "only probes went out");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_call_may_raise_the_estimate_but_never_lower_it() {
        let admission = Admission::default();
        let started = Instant::now();
        admission.record(started, MS(1000), false);
        // Cut after 20 ms: it would have taken at least 20 ms, which says nothing new.
        tokio::time::advance(MS(10)).await;
        admission.record(Instant::now(), MS(20), true);
        assert_eq!(admission.estimate(), MS(1000));
        // Cut after 800 ms, again and again: at least 800 ms, counted as twice that.
        for _ in 0..10 {
            tokio::time::advance(MS(100)).await;
            admission.record(Instant::now(), MS(800), true);
            assert!(
                admission.estimate() >= MS(1000),
                "{:?}",
                admission.estimate()
            );
        }
        assert_eq!(admission.estimate(), MS(1600));
        // A call that finished says how long it took: the estimate follows it down.
        tokio::time::advance(MS(10)).await;
        admission.record(Instant::now(), MS(5), false);
        assert!(
            admission.estimate() < MS(1000),
            "{:?}",
            admission.estimate()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_call_with_enough_budget_to_learn_something_probes() {
        let admission = Admission::default();
        admission.record(Instant::now(), MS(1000), false);
        let tiny = MS(1000) / MIN_PROBE_SHARE - MS(1);
        assert!(matches!(
            admission.check(tiny, Duration::ZERO, true),
            Verdict::Refuse { .. }
        ));
        assert_eq!(
            admission.check(MS(1000) / MIN_PROBE_SHARE, Duration::ZERO, true),
            Verdict::Probe
        );
        // Nobody with enough budget comes: after a while any call may probe, so admission
        // still reopens when only short callers are left and the downstream gets quick.
        tokio::time::advance(PROBE_INTERVAL).await;
        assert!(matches!(
            admission.check(tiny, Duration::ZERO, true),
            Verdict::Refuse { .. }
        ));
        tokio::time::advance(PROBE_STARVED_AFTER).await;
        assert_eq!(admission.check(tiny, Duration::ZERO, true), Verdict::Probe);
    }

    #[tokio::test(start_paused = true)]
    async fn observe_asks_without_using_up_probes() {
        let admission = Admission::default();
        admission.record(Instant::now(), MS(700), true);
        for _ in 0..10 {
            assert!(matches!(
                admission.check(MS(695), Duration::ZERO, false),
                Verdict::Refuse { .. }
            ));
        }
        assert_eq!(
            admission.check(MS(695), Duration::ZERO, true),
            Verdict::Probe
        );
        assert!(matches!(
            admission.check(MS(695), Duration::ZERO, true),
            Verdict::Refuse { .. }
        ));
        // A caller with more than twice the cut budget can still afford it.
        assert_eq!(
            admission.check(MS(1500), Duration::ZERO, true),
            Verdict::Admit
        );
    }

    #[test]
    fn the_pool_wait_is_added_only_when_no_slot_is_free_and_never_past_the_limit() {
        let limit = MS(40);
        assert_eq!(expected_wait(9, 10, 0, MS(100), limit), Duration::ZERO);
        assert_eq!(expected_wait(10, 10, 0, MS(100), limit), MS(10));
        assert_eq!(expected_wait(10, 10, 2, MS(100), limit), MS(30));
        assert_eq!(expected_wait(10, 10, 50, MS(100), limit), limit);
    }
}
