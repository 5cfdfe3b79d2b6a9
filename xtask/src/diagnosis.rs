//! The three-way answer of a run: pool queue, slow downstream or saturated executor?
//! (docs/operating.md). From the services' metrics alone, as a reader of the dashboard
//! would decide, never from k6's latencies: the share of time the tokio workers were busy,
//! the catalog calls' time (pool wait excluded), and the calls that waited for a slot.
//! Pure, so each case is unit-tested with made-up figures.
//!
//! The order matters: a saturated executor makes everything on it late, the timing of the
//! call and the wait for a slot included, so it is asked first; a slow downstream fills
//! the pool's queue, so it comes next. Only a queue before a normal downstream is a pool queue.

use std::collections::BTreeMap;
use std::fmt;

/// Workers busy at least this share of their time: the executor is saturated.
pub const SATURATED_BUSY_RATIO: f64 = 0.9;
/// A catalog call taking at least this share of the budget on average is slow (one at
/// normal speed takes a few ms).
pub const SLOW_CALL_SHARE_OF_BUDGET: f64 = 0.1;
/// At least this many calls waiting for a slot, on average: the pool queues.
pub const QUEUED_PENDING_MEAN: f64 = 1.0;

/// The services whose runtimes are read, with the figure of each one's busy ratio.
pub const SERVICES: [(&str, &str); 2] = [
    ("orders-service", "orders_busy_ratio"),
    ("catalog-service", "catalog_busy_ratio"),
];

/// What the metrics of one run say.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The workers of these services were busy nearly all the time.
    SaturatedExecutor(Vec<&'static str>),
    /// The catalog call itself took a good share of the budget.
    SlowDownstream,
    /// Calls waited for a pool slot while the downstream answered at its normal speed.
    PoolQueue,
    /// None of the three.
    Neither,
    /// A figure the answer needs is missing (the runtime metrics were off, a scrape
    /// failed): no answer rather than a wrong one.
    Unknown(String),
}

impl Answer {
    /// The short name, as the dashboard row asks the question.
    pub fn name(&self) -> &'static str {
        match self {
            Self::SaturatedExecutor(_) => "saturated executor",
            Self::SlowDownstream => "slow downstream",
            Self::PoolQueue => "pool queue",
            Self::Neither => "none of the three",
            Self::Unknown(_) => "unknown",
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SaturatedExecutor(services) => {
                write!(f, "{} ({})", self.name(), services.join(", "))
            }
            Self::Unknown(why) => write!(f, "{} ({why})", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

/// The answer for one run's `figures` under a budget of `budget_ms`.
pub fn answer(figures: &BTreeMap<String, f64>, budget_ms: f64) -> Answer {
    let figure = |name: &str| figures.get(name).copied().filter(|v| v.is_finite());
    let mut saturated = Vec::new();
    for (service, name) in SERVICES {
        match figure(name) {
            Some(ratio) if ratio >= SATURATED_BUSY_RATIO => saturated.push(service),
            Some(_) => {}
            None => return Answer::Unknown(format!("no {name}")),
        }
    }
    if !saturated.is_empty() {
        return Answer::SaturatedExecutor(saturated);
    }
    // No call in the window is no evidence of a slow downstream.
    if figure("catalog_call_mean_ms").is_some_and(|ms| ms >= SLOW_CALL_SHARE_OF_BUDGET * budget_ms)
    {
        return Answer::SlowDownstream;
    }
    match figure("pending_mean") {
        Some(pending) if pending >= QUEUED_PENDING_MEAN => Answer::PoolQueue,
        Some(_) => Answer::Neither,
        None => Answer::Unknown("no pending_mean".to_owned()),
    }
}

/// One sentence per side: its runs' answer, or each answer with its count.
pub fn of_runs(answers: &[Answer]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for answer in answers {
        let text = answer.to_string();
        match counts.iter_mut().find(|(t, _)| *t == text) {
            Some((_, n)) => *n += 1,
            None => counts.push((text, 1)),
        }
    }
    match counts.as_slice() {
        [] => "no run".to_owned(),
        [(text, _)] => text.clone(),
        _ => {
            let parts: Vec<String> = counts
                .iter()
                .map(|(t, n)| format!("{t} in {n} run{}", if *n == 1 { "" } else { "s" }))
                .collect();
            format!("runs disagree: {}", parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    /// A run where nothing is wrong: idle runtimes, fast calls, no queue.
    const CALM: &[(&str, f64)] = &[
        ("orders_busy_ratio", 0.2),
        ("catalog_busy_ratio", 0.05),
        ("catalog_call_mean_ms", 2.0),
        ("pending_mean", 0.0),
    ];

    fn calm_but(changes: &[(&str, f64)]) -> BTreeMap<String, f64> {
        let mut f = figures(CALM);
        f.extend(figures(changes));
        f
    }

    #[test]
    fn the_seed_run_reads_as_a_slow_downstream() {
        // Legacy in the seed's run: 1 s calls, 200 waiting for a slot.
        let legacy = calm_but(&[("catalog_call_mean_ms", 1000.0), ("pending_mean", 198.0)]);
        assert_eq!(answer(&legacy, 700.0), Answer::SlowDownstream);
        // Propagate: few calls, each cut at the deadline, the queue short.
        let propagate = calm_but(&[("catalog_call_mean_ms", 690.0), ("pending_mean", 0.4)]);
        assert_eq!(answer(&propagate, 700.0), Answer::SlowDownstream);
    }

    #[test]
    fn a_spinning_catalog_reads_as_its_saturated_executor_before_its_slow_calls() {
        let saturated = calm_but(&[
            ("catalog_busy_ratio", 0.97),
            ("catalog_call_mean_ms", 400.0),
        ]);
        let got = answer(&saturated, 700.0);
        assert_eq!(got, Answer::SaturatedExecutor(vec!["catalog-service"]));
        assert_eq!(got.to_string(), "saturated executor (catalog-service)");
        let both = calm_but(&[("orders_busy_ratio", 0.9), ("catalog_busy_ratio", 1.02)]);
        assert_eq!(
            answer(&both, 700.0),
            Answer::SaturatedExecutor(vec!["orders-service", "catalog-service"])
        );
    }

    #[test]
    fn a_queue_with_fast_calls_is_a_pool_queue_and_the_thresholds_are_inclusive() {
        let queued = calm_but(&[("pending_mean", 1.0), ("catalog_call_mean_ms", 69.9)]);
        assert_eq!(answer(&queued, 700.0), Answer::PoolQueue);
        let slow = calm_but(&[("pending_mean", 30.0), ("catalog_call_mean_ms", 70.0)]);
        assert_eq!(answer(&slow, 700.0), Answer::SlowDownstream);
        let busy = calm_but(&[("orders_busy_ratio", 0.89)]);
        assert_eq!(answer(&busy, 700.0), Answer::Neither);
    }

    #[test]
    fn no_call_in_the_window_is_no_slow_downstream() {
        let mut f = calm_but(&[("pending_mean", 3.0)]);
        f.remove("catalog_call_mean_ms");
        assert_eq!(answer(&f, 700.0), Answer::PoolQueue);
    }

    #[test]
    fn a_missing_or_nan_runtime_figure_gives_no_answer() {
        for name in ["orders_busy_ratio", "catalog_busy_ratio", "pending_mean"] {
            let mut missing = figures(CALM);
            missing.remove(name);
            let got = answer(&missing, 700.0);
            assert!(
                matches!(&got, Answer::Unknown(why) if why.contains(name)),
                "{name}: {got}"
            );
            let nan = calm_but(&[(name, f64::NAN)]);
            assert!(matches!(answer(&nan, 700.0), Answer::Unknown(_)), "{name}");
        }
        // Even when the other figures point elsewhere.
        let mut slow = calm_but(&[("catalog_call_mean_ms", 900.0)]);
        slow.remove("catalog_busy_ratio");
        assert_eq!(answer(&slow, 700.0).name(), "unknown");
    }

    #[test]
    fn the_runs_of_a_side_are_summed_up_in_one_sentence() {
        let slow = Answer::SlowDownstream;
        let busy = Answer::SaturatedExecutor(vec!["catalog-service"]);
        assert_eq!(of_runs(&[slow.clone(), slow.clone()]), "slow downstream");
        assert_eq!(
            of_runs(&[busy.clone(), slow, busy]),
            "runs disagree: saturated executor (catalog-service) in 2 runs, slow downstream in 1 run"
        );
        assert_eq!(of_runs(&[]), "no run");
    }
}
