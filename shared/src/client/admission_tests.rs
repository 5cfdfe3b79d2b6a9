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
    sent: usize,
    refused: usize,
    first_admitted_after: Option<Instant>,
}

impl Sim {
    fn new() -> Self {
        Self {
            admission: Admission::default(),
            in_flight: Vec::new(),
            sent: 0,
            refused: 0,
            first_admitted_after: None,
        }
    }

    /// Runs arrivals for `period` against a downstream taking `latency(i)` for the i-th
    /// call; calls longer than the budget are cut at it.
    async fn run(&mut self, period: Duration, latency: impl Fn(usize) -> Duration) {
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
            match self.admission.check(BUDGET, Duration::ZERO, true) {
                Verdict::Refuse { .. } => self.refused += 1,
                verdict => {
                    if verdict == Verdict::Admit && self.first_admitted_after.is_none() {
                        self.first_admitted_after = Some(now);
                    }
                    let took = latency(self.sent);
                    let (took, cut) = if took > BUDGET {
                        (BUDGET, true)
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
