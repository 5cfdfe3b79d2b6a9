//! [`Admission`]: refuse a call that the recent latency says cannot finish in time,
//! before it takes a slot. A [`Plugin`] of the budgeted client.
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
//! The estimate is a quantile of the last `WINDOW` call times, each weighted by how
//! recently its call *started* (halving every `HALF_LIFE`). Weighting by start, not
//! by completion, is what makes recovery quick: when the downstream gets fast, the slow
//! calls started before that still complete for a while, but they started earlier than
//! the first fast call, so they count for little next to it.
//!
//! The quantile is a *low* one (`MIN_SUCCESS_CHANCE`, 10 %): a call is refused only
//! when the chance that it finishes in what it has left is below one in ten. A high
//! quantile would refuse calls that have a good chance: with a catalog answering in 200
//! to 800 ms and a 700 ms budget, 80 % of calls succeed, and refusing them all because
//! the p90 is 740 ms would throw that goodput away. Refusing only calls with a small
//! chance costs nothing where calls might succeed, and still refuses everything when the
//! downstream is slower than every budget.
//!
//! # Censored calls
//!
//! A call cut at its deadline says only that the downstream took *at least* that long:
//! a censored observation. The chance of finishing in time is estimated the way
//! survival analysis does it, Kaplan–Meier with the recency weights: walking up the call
//! times, each finished call lowers the chance of still running by its weight over the
//! weight of the calls that ran at least that long; a cut call only leaves the set of
//! calls still running at its cut, and says nothing about any time above it. The
//! estimate is the first time by which the chance of having finished reaches 10 %. When
//! the calls that finished are too few for that (every recent call was cut), the
//! downstream is slower than anything seen: the estimate is then `CENSORED_FACTOR`
//! times the longest cut, longer than those callers could wait, by a margin that
//! callers with much more budget can still afford.
//!
//! So a cut call can never lower the estimate; only a call that finished can say the
//! downstream got quicker. Counted instead as a call time, a caller cut early (one
//! with a few ms of budget) would look quick, and the callers with the whole budget
//! would all be admitted and cut (docs/performance.md has the measurement).
//!
//! # Noticing recovery
//!
//! Refused calls produce no samples, so while refusing the estimate would never change.
//! One call per [`PROBE_INTERVAL`] is let through anyway (a *probe*), so the estimate
//! keeps following the downstream and admission reopens within about one interval of
//! the downstream getting fast.
//!
//! The probe goes to a call with enough budget to learn something: at least
//! 1/`MIN_PROBE_SHARE` of the estimate. Callers like the ones that were cut have about
//! half the estimate (it is twice their cut), so they qualify with room to spare; a caller with a few ms left does not, since it would be cut long before a slow
//! downstream answered. If no such call comes for `PROBE_STARVED_AFTER`, any refused
//! call may probe: when only short callers are left, one of them must find out that the
//! downstream got quick, and cut, it cannot lower the estimate anyway.
//!
//! The pool wait is added per call: a call that must queue for a slot needs the wait
//! on top of the call itself (see `expected_wait`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Admit, CallStart, Event, Plugin};

/// Recent calls the estimate is taken from.
const WINDOW: usize = 64;
/// A call's weight halves for every this much earlier it started than the newest.
const HALF_LIFE: Duration = Duration::from_millis(250);
/// A call is refused when fewer than this share of recent calls were quick enough.
const MIN_SUCCESS_CHANCE: f64 = 0.1;
/// When too few calls finished to reach the quantile, the estimate is this many times
/// the longest cut.
const CENSORED_FACTOR: u32 = 2;
/// While refusing, one call per interval goes through as a probe.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// A probe needs at least this fraction (1/N) of the estimate to spend.
const MIN_PROBE_SHARE: u32 = 4;
/// How long a due probe waits for a call with enough budget before any call may take it.
const PROBE_STARVED_AFTER: Duration = Duration::from_secs(1);

/// One call: when it started, how long it ran, and whether it was cut then (it would
/// have taken at least `took`).
#[derive(Clone, Copy, Debug)]
struct Sample {
    started: Instant,
    took: Duration,
    censored: bool,
}

/// A call as the window keeps it: its recency weight is computed once, when it is
/// recorded, and not again on every walk.
#[derive(Clone, Copy, Debug)]
struct Entry {
    took: Duration,
    censored: bool,
    /// `2^((started − base) / HALF_LIFE)`. Only the ratios of the weights matter to
    /// Kaplan–Meier, so weighting from a fixed base is the same as weighting by age
    /// from the newest call.
    weight: f64,
    /// The number the call got when recorded: the oldest has the smallest.
    order: u64,
}

/// Past this exponent the window rebases its weights, far below where `f64` overflows.
const REBASE_EXPONENT: f64 = 512.0;

/// The last [`WINDOW`] calls, kept in the order the estimate walks them: by call time,
/// a call that finished before one cut at the same time, and otherwise in the order
/// they were recorded. Every call records one and recomputes the estimate, so recording
/// is an insertion into a window kept sorted and a walk along it, not a sort per call
/// (docs/performance.md).
#[derive(Debug)]
struct Window {
    /// At most [`WINDOW`] calls, in the estimate's order.
    sorted: Vec<Entry>,
    /// The number the next recorded call gets.
    next: u64,
    /// The start the weights are measured from (the first call's, then a rebase's).
    base: Option<Instant>,
}

impl Window {
    fn new() -> Self {
        Self {
            sorted: Vec::with_capacity(WINDOW),
            next: 0,
            base: None,
        }
    }

    /// Adds a call, and drops the oldest once the window is full.
    fn record(&mut self, sample: Sample) {
        if self.sorted.len() == WINDOW {
            let oldest = self.next - WINDOW as u64;
            if let Some(at) = self.sorted.iter().position(|e| e.order == oldest) {
                self.sorted.remove(at);
            }
        }
        let entry = Entry {
            took: sample.took,
            censored: sample.censored,
            weight: self.weight(sample.started),
            order: self.next,
        };
        // A call cut at the same time as one finished was still running then, so it
        // sorts after it; among calls of the same time and kind, the newest goes last
        // (the order a stable sort of the calls as recorded gives).
        let key = (entry.took, entry.censored);
        let at = self.sorted.partition_point(|e| (e.took, e.censored) <= key);
        self.sorted.insert(at, entry);
        self.next += 1;
    }

    /// The weight of a call started at `started`, rebasing every weight first when it
    /// would grow past [`REBASE_EXPONENT`]. A weight never reaches zero, so the walk
    /// always has some weight at risk.
    fn weight(&mut self, started: Instant) -> f64 {
        let base = *self.base.get_or_insert(started);
        let exponent = if started >= base {
            started.duration_since(base).as_secs_f64()
        } else {
            -base.duration_since(started).as_secs_f64()
        } / HALF_LIFE.as_secs_f64();
        if exponent <= REBASE_EXPONENT {
            return exponent.exp2().max(f64::MIN_POSITIVE);
        }
        let shrink = (-exponent).exp2();
        for entry in &mut self.sorted {
            entry.weight = (entry.weight * shrink).max(f64::MIN_POSITIVE);
        }
        self.base = Some(started);
        1.0
    }

    fn quantile(&self, quantile: f64) -> Duration {
        weighted_quantile(&self.sorted, quantile)
    }
}

/// The latency estimate and probe clock of one downstream: a client's plugin.
///
/// ```
/// use deadline_propagation::admission::Admission;
/// use deadline_propagation::client::{BudgetedClient, ClientConfig};
/// use deadline_propagation::Downstream;
///
/// let config = ClientConfig::new(Downstream::new("inventory").unwrap(), "http://127.0.0.1:8082");
/// let client = BudgetedClient::new(config).unwrap().plugin(Admission::new());
/// ```
#[derive(Debug)]
pub struct Admission {
    samples: Mutex<Window>,
    /// The current estimate in nanoseconds: read on every call without the lock.
    estimate_nanos: AtomicU64,
    /// Nanoseconds after `origin` before which no further probe goes out.
    next_probe: AtomicU64,
    origin: Instant,
}

impl Default for Admission {
    fn default() -> Self {
        Self::new()
    }
}

impl Plugin for Admission {
    fn admit(&self, call: &CallStart) -> Admit {
        let wait = expected_wait(
            call.active,
            call.max_in_flight,
            call.pending,
            self.estimate(),
            call.acquire_timeout,
        );
        self.check(call.available, wait, call.may_probe)
    }

    /// What nine recent calls in ten took, for the deadline's check of an extra
    /// attempt (where no hedging history knows better).
    fn likely_attempt(&self) -> Option<Duration> {
        Some(self.quantile(LIKELY))
    }

    fn on_event(&self, event: &Event) {
        if let Event::Attempt(attempt) = event
            && attempt.learns
        {
            self.record(attempt.started, attempt.took, attempt.censored);
        }
    }

    fn readings(&self) -> Vec<(&'static str, Duration)> {
        vec![("latency_estimate", self.estimate())]
    }
}

/// The share of attempts that must finish in what is left for an extra attempt to go.
const LIKELY: f64 = 0.9;

impl Admission {
    /// An admission with no history: it admits everything until calls are recorded.
    pub fn new() -> Self {
        Self {
            samples: Mutex::new(Window::new()),
            estimate_nanos: AtomicU64::new(0),
            next_probe: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }

    /// What a call started now is expected to take (pool wait not included).
    pub fn estimate(&self) -> Duration {
        Duration::from_nanos(self.estimate_nanos.load(Ordering::Relaxed))
    }

    /// The `quantile` of the recent calls (Kaplan–Meier, like the estimate), for the
    /// deadline's check of an extra attempt.
    fn quantile(&self, quantile: f64) -> Duration {
        let samples = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        samples.quantile(quantile)
    }

    /// The verdict for a call with `available` to spend after waiting `wait` for a slot.
    /// `may_probe: false` (observe mode) asks only what the verdict would be, and uses
    /// up no probe.
    fn check(&self, available: Duration, wait: Duration, may_probe: bool) -> Admit {
        let estimate = self.estimate();
        let needed = estimate + wait;
        if available >= needed {
            Admit::Yes
        } else if may_probe && self.take_probe(available >= estimate / MIN_PROBE_SHARE) {
            Admit::Probe
        } else {
            Admit::Refuse { needed }
        }
    }

    /// Records a call that started at `started` and ran for `took`; `censored` when it
    /// was cut then (at its deadline: it would have taken at least `took`).
    fn record(&self, started: Instant, took: Duration, censored: bool) {
        let mut samples = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        samples.record(Sample {
            started,
            took,
            censored,
        });
        let estimate = samples.quantile(MIN_SUCCESS_CHANCE);
        self.estimate_nanos.store(
            u64::try_from(estimate.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
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

/// The first call time by which, by the weighted Kaplan–Meier estimate, a share
/// `quantile` of calls have finished; [`CENSORED_FACTOR`] times the longest cut when no
/// time reaches it (see the module's "Censored calls"). `sorted` is in [`Window`]'s
/// order.
fn weighted_quantile(sorted: &[Entry], quantile: f64) -> Duration {
    let mut at_risk: f64 = sorted.iter().map(|e| e.weight).sum();
    let mut still_running = 1.0;
    let mut longest = Duration::ZERO;
    for entry in sorted {
        if !entry.censored {
            still_running *= 1.0 - entry.weight / at_risk;
            if 1.0 - still_running >= quantile - f64::EPSILON {
                return entry.took;
            }
        }
        at_risk -= entry.weight;
        longest = entry.took;
    }
    longest.saturating_mul(CENSORED_FACTOR)
}

/// How long a call is expected to wait for a slot: nothing while one is free; else its
/// place in the queue times how often a slot frees up (`estimate / max_in_flight`),
/// never more than the pool's own acquire limit.
fn expected_wait(
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
        /// Time between two arrivals.
        tick: Duration,
        in_flight: Vec<(Instant, Instant, Duration, bool)>,
        arrivals: usize,
        sent: usize,
        refused: usize,
        first_admitted_after: Option<Instant>,
    }

    impl Sim {
        fn new() -> Self {
            Self::arriving(1000 / TICK.as_millis() as u32)
        }

        /// A simulation with `rate` arrivals a second.
        fn arriving(rate: u32) -> Self {
            Self {
                admission: Admission::default(),
                tick: Duration::from_secs(1) / rate,
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
                tokio::time::advance(self.tick).await;
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
                    Admit::Refuse { .. } => self.refused += 1,
                    verdict => {
                        if verdict == Admit::Yes && self.first_admitted_after.is_none() {
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
        admission.record(Instant::now(), MS(1000), false);
        assert_eq!(admission.estimate(), MS(1000));
        // Cut after 20 ms, or 800: it would have taken at least that long, which says
        // nothing against the call that took a second.
        tokio::time::advance(MS(10)).await;
        admission.record(Instant::now(), MS(20), true);
        assert_eq!(admission.estimate(), MS(1000));
        for _ in 0..10 {
            tokio::time::advance(MS(100)).await;
            admission.record(Instant::now(), MS(800), true);
            assert_eq!(admission.estimate(), MS(1000));
        }
        // Cut later than every call that finished, again and again: slower than
        // anything seen, so twice the longest cut.
        for _ in 0..10 {
            tokio::time::advance(MS(100)).await;
            admission.record(Instant::now(), MS(1200), true);
        }
        assert_eq!(admission.estimate(), MS(2400));
        // A call that finished says how long it took: the estimate follows it down.
        tokio::time::advance(MS(10)).await;
        admission.record(Instant::now(), MS(5), false);
        assert!(
            admission.estimate() < MS(1000),
            "{:?}",
            admission.estimate()
        );
    }

    #[test]
    fn the_estimate_is_the_kaplan_meier_quantile_of_finished_and_cut_calls() {
        let now = Instant::now();
        let sample = |ms, censored| Sample {
            started: now,
            took: MS(ms),
            censored,
        };
        let window = |samples: &[Sample]| {
            let mut window = Window::new();
            for &sample in samples {
                window.record(sample);
            }
            window
        };
        // Equal weights. Ten finished calls of 10..100 ms: the 10 % point is the first.
        let finished: Vec<Sample> = (1..=10).rev().map(|i| sample(i * 10, false)).collect();
        assert_eq!(window(&finished).quantile(0.1), MS(10));
        assert_eq!(window(&finished).quantile(0.5), MS(50));
        // Nine cut at 5 ms before any finished: they leave the risk set at once and
        // take nothing away from the finished one's chance, which is now all of it.
        let mut cut_early = vec![sample(100, false)];
        cut_early.extend((0..9).map(|_| sample(5, true)));
        assert_eq!(window(&cut_early).quantile(0.1), MS(100));
        // Every call cut: twice the longest cut.
        let all_cut = [20, 695, 300].map(|ms| sample(ms, true));
        assert_eq!(window(&all_cut).quantile(0.1), MS(1390));
        assert_eq!(window(&[]).quantile(0.1), Duration::ZERO);
    }

    #[test]
    fn the_window_keeps_the_newest_calls_in_the_estimates_order() {
        let now = Instant::now();
        let mut window = Window::new();
        // One more call than the window holds; the first recorded, 32 ms, is neither
        // the shortest nor the longest.
        let order = std::iter::once(32).chain((0..=WINDOW as u64).filter(|&ms| ms != 32));
        for ms in order {
            window.record(Sample {
                started: now,
                took: MS(ms),
                censored: ms % 2 == 1,
            });
        }
        let kept: Vec<Duration> = window.sorted.iter().map(|e| e.took).collect();
        let expected: Vec<Duration> = (0..=WINDOW as u64).filter(|&ms| ms != 32).map(MS).collect();
        assert_eq!(kept, expected, "the oldest left first");
        // A finished call sorts before a cut one of the same time, whatever came first.
        window.record(Sample {
            started: now,
            took: MS(3),
            censored: false,
        });
        let at_three: Vec<bool> = window
            .sorted
            .iter()
            .filter(|e| e.took == MS(3))
            .map(|e| e.censored)
            .collect();
        assert_eq!(at_three, [false, true]);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_call_with_enough_budget_to_learn_something_probes() {
        let admission = Admission::default();
        admission.record(Instant::now(), MS(1000), false);
        let tiny = MS(1000) / MIN_PROBE_SHARE - MS(1);
        assert!(matches!(
            admission.check(tiny, Duration::ZERO, true),
            Admit::Refuse { .. }
        ));
        assert_eq!(
            admission.check(MS(1000) / MIN_PROBE_SHARE, Duration::ZERO, true),
            Admit::Probe
        );
        // Nobody with enough budget comes: after a while any call may probe, so admission
        // still reopens when only short callers are left and the downstream gets quick.
        tokio::time::advance(PROBE_INTERVAL).await;
        assert!(matches!(
            admission.check(tiny, Duration::ZERO, true),
            Admit::Refuse { .. }
        ));
        tokio::time::advance(PROBE_STARVED_AFTER).await;
        assert_eq!(admission.check(tiny, Duration::ZERO, true), Admit::Probe);
    }

    #[tokio::test(start_paused = true)]
    async fn observe_asks_without_using_up_probes() {
        let admission = Admission::default();
        admission.record(Instant::now(), MS(700), true);
        for _ in 0..10 {
            assert!(matches!(
                admission.check(MS(695), Duration::ZERO, false),
                Admit::Refuse { .. }
            ));
        }
        assert_eq!(admission.check(MS(695), Duration::ZERO, true), Admit::Probe);
        assert!(matches!(
            admission.check(MS(695), Duration::ZERO, true),
            Admit::Refuse { .. }
        ));
        // A caller with more than twice the cut budget can still afford it.
        assert_eq!(admission.check(MS(1500), Duration::ZERO, true), Admit::Yes);
    }

    #[test]
    fn the_pool_wait_is_added_only_when_no_slot_is_free_and_never_past_the_limit() {
        let limit = MS(40);
        assert_eq!(expected_wait(9, 10, 0, MS(100), limit), Duration::ZERO);
        assert_eq!(expected_wait(10, 10, 0, MS(100), limit), MS(10));
        assert_eq!(expected_wait(10, 10, 2, MS(100), limit), MS(30));
        assert_eq!(expected_wait(10, 10, 50, MS(100), limit), limit);
    }

    /// The measured case, from a cold start: a downstream that was fast (5 ms) turns
    /// slow (1 s) while 60 callers a second have 695 ms to spend and 8 a second have
    /// 20 ms. Nothing teaches admission the slow downstream first: only the calls cut
    /// at their deadlines can. Calls reaching the downstream, per second, over 25 s.
    async fn calls_per_s_from_a_cold_start(tiny: Duration, tiny_every: usize) -> f64 {
        let rate = 68;
        let mut sim = Sim::arriving(rate);
        let budget = move |i: usize| {
            if i.is_multiple_of(tiny_every) {
                tiny
            } else {
                BUDGET
            }
        };
        sim.run_with(Duration::from_secs(5), budget, |_| MS(5))
            .await;
        assert_eq!(sim.refused, 0, "a fast downstream is never refused");
        sim.reset_counts();
        let period = Duration::from_secs(25);
        sim.run_with(period, budget, |_| MS(1000)).await;
        sim.sent as f64 / period.as_secs_f64()
    }

    #[tokio::test(start_paused = true)]
    async fn from_a_cold_start_callers_near_their_deadline_do_not_switch_admission_off() {
        // One arrival in eight has 20 ms (a 25 ms budget less the reserve).
        let per_s = calls_per_s_from_a_cold_start(MS(20), 8).await;
        eprintln!("{per_s:.2} calls/s reached the slow downstream");
        assert!(
            per_s <= 10.0,
            "{per_s:.1} calls/s reached the slow downstream"
        );
    }

    /// The same for any mix: the short callers' budget from 10 ms to the main one's,
    /// from one caller in twenty to every other one.
    #[tokio::test(start_paused = true)]
    async fn from_a_cold_start_no_mix_of_budgets_switches_admission_off() {
        for tiny in [10, 25, 50, 100, 300, 600].map(MS) {
            for every in [20, 8, 4, 2] {
                let per_s = calls_per_s_from_a_cold_start(tiny, every).await;
                assert!(
                    per_s <= 10.0,
                    "{per_s:.1} calls/s with one caller in {every} at {tiny:?}"
                );
            }
        }
    }

    proptest::proptest! {
        /// The window gives the estimate what sorting the last `WINDOW` calls and
        /// weighting each by its age from the newest start would: the same calls, in the
        /// same order, with the same weights up to rounding. Starts up to 200 s apart
        /// make the window rebase its weights on the way.
        #[test]
        fn the_window_agrees_with_sorting_and_weighting_the_last_calls(
            calls in proptest::collection::vec((0u64..50, 0u64..40, proptest::bool::ANY), 0..200),
            spread in proptest::sample::select(vec![1u64, 4000]),
            quantile in 0.0f64..1.0,
        ) {
            let origin = Instant::now();
            let mut window = Window::new();
            let mut all = Vec::new();
            for (started_ms, took_ms, censored) in calls {
                let sample = Sample {
                    started: origin + MS(started_ms * spread),
                    took: MS(took_ms),
                    censored,
                };
                window.record(sample);
                all.push(sample);
            }
            let mut last: Vec<Sample> = all[all.len().saturating_sub(WINDOW)..].to_vec();
            last.sort_by_key(|s| (s.took, s.censored));
            let newest = last.iter().map(|s| s.started).max();
            let by_age: Vec<Entry> = last
                .iter()
                .map(|s| Entry {
                    took: s.took,
                    censored: s.censored,
                    weight: (-(newest.unwrap() - s.started).as_secs_f64()
                        / HALF_LIFE.as_secs_f64())
                    .exp2(),
                    order: 0,
                })
                .collect();
            proptest::prop_assert_eq!(
                window.quantile(quantile),
                weighted_quantile(&by_age, quantile)
            );
        }
    }
}
