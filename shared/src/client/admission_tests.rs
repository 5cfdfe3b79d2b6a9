//! Admission under paused time: a simulated downstream, one arrival every 10 ms.

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
