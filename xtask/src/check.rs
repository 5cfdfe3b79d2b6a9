//! `--check`: the acceptance rules of docs/design.md §9 over a summary. Pure, so each rule is
//! unit-tested with made-up figures.

use crate::summary::Summary;

/// The least goodput propagate must reach, as a multiple of legacy's, under `goodput`.
pub const MIN_GOODPUT_RATIO: f64 = 1.5;
/// The most orders-service's memory may grow during a propagate load, MiB.
pub const MAX_RSS_GROWTH_MIB: f64 = 32.0;
/// The longest propagate may take to serve a whole second in budget after the fault.
pub const MAX_RECOVERY_MS: f64 = 1000.0;

/// One rule's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// What was checked.
    pub rule: String,
    /// Whether it held.
    pub ok: bool,
    /// The numbers behind it.
    pub detail: String,
}

fn verdict(rule: &str, ok: bool, detail: String) -> Verdict {
    Verdict {
        rule: rule.to_owned(),
        ok,
        detail,
    }
}

/// Every rule that applies to `summary`'s scenario.
pub fn check(summary: &Summary, budget_ms: f64, margin_ms: f64) -> Vec<Verdict> {
    let mut verdicts = vec![
        k6_passed(summary),
        propagate_p99(summary, budget_ms + margin_ms),
        memory_flat(summary),
    ];
    match summary.scenario.as_str() {
        "goodput" => verdicts.push(goodput_ratio(summary)),
        "seed" => verdicts.push(legacy_queues(summary, budget_ms)),
        "recovery" => verdicts.push(recovered(summary)),
        _ => {}
    }
    verdicts
}

/// k6 exits 0 in every run: no unexpected status, propagate's p99 threshold held.
fn k6_passed(summary: &Summary) -> Verdict {
    let failed: Vec<String> = summary
        .runs
        .iter()
        .filter(|r| r.figures.get("k6_exit") != Some(&0.0))
        .map(|r| {
            format!(
                "{} #{}: {}",
                r.mode,
                r.repeat,
                r.figures.get("k6_exit").unwrap_or(&-1.0)
            )
        })
        .collect();
    let detail = if failed.is_empty() {
        "every run exited 0".to_owned()
    } else {
        failed.join(", ")
    };
    verdict("k6 exit code", failed.is_empty(), detail)
}

/// Propagate answers within the budget plus the margin, at p99, in every run.
fn propagate_p99(summary: &Summary, limit_ms: f64) -> Verdict {
    let worst = summary
        .values("propagate", "p99_ms")
        .into_iter()
        .fold(0.0, f64::max);
    verdict(
        "propagate p99 within budget + margin",
        worst <= limit_ms,
        format!("worst p99 {worst:.0} ms, limit {limit_ms:.0} ms"),
    )
}

/// orders-service's memory stays flat under load in propagate mode.
fn memory_flat(summary: &Summary) -> Verdict {
    let starts = summary.values("propagate", "rss_start_mib");
    let peaks = summary.values("propagate", "rss_peak_mib");
    let growth = starts
        .iter()
        .zip(&peaks)
        .map(|(s, p)| p - s)
        .fold(0.0, f64::max);
    verdict(
        "propagate memory flat",
        growth <= MAX_RSS_GROWTH_MIB,
        format!("largest RSS growth {growth:.1} MiB, limit {MAX_RSS_GROWTH_MIB} MiB"),
    )
}

/// The headline: propagate serves at least 1.5 times legacy's goodput.
fn goodput_ratio(summary: &Summary) -> Verdict {
    let ratio = summary.ratio("goodput_per_s").unwrap_or(f64::INFINITY);
    let median = |m| summary.get(m, "goodput_per_s").map_or(0.0, |s| s.median);
    verdict(
        "goodput propagate / legacy",
        ratio >= MIN_GOODPUT_RATIO && median("propagate") > 0.0,
        format!(
            "{:.1} / {:.1} orders/s = {ratio:.2}, at least {MIN_GOODPUT_RATIO}",
            median("propagate"),
            median("legacy")
        ),
    )
}

/// The seed's run shows the "before": legacy queues (pending calls, p99 past the budget).
fn legacy_queues(summary: &Summary, budget_ms: f64) -> Verdict {
    let pending = summary
        .get("legacy", "pending_peak")
        .map_or(0.0, |s| s.median);
    let p99 = summary.get("legacy", "p99_ms").map_or(0.0, |s| s.median);
    verdict(
        "legacy queues in the seed's run",
        pending > 0.0 && p99 > budget_ms,
        format!("legacy pending peak {pending:.0}, p99 {p99:.0} ms (budget {budget_ms:.0} ms)"),
    )
}

/// Propagate serves a whole second in budget within 1 s of the fault going away.
fn recovered(summary: &Summary) -> Verdict {
    let times = summary.values("propagate", "recovery_ms");
    let worst = times.iter().copied().fold(
        0.0,
        |a: f64, b| if b.is_nan() { f64::INFINITY } else { a.max(b) },
    );
    verdict(
        "propagate recovers within 1 s",
        !times.is_empty() && worst <= MAX_RECOVERY_MS,
        format!("slowest recovery {worst:.0} ms, limit {MAX_RECOVERY_MS:.0} ms"),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::stats::spread;
    use crate::summary::{MODES, RunFigures};

    fn summary(scenario: &str, runs: &[(&str, &[(&str, f64)])]) -> Summary {
        let runs: Vec<RunFigures> = runs
            .iter()
            .enumerate()
            .map(|(i, (mode, figures))| RunFigures {
                mode: (*mode).into(),
                repeat: i / 2,
                figures: figures.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            })
            .collect();
        let mut s = Summary {
            scenario: scenario.into(),
            commit: String::new(),
            profile: String::new(),
            load: serde_json::Value::Null,
            repeats: 1,
            modes: BTreeMap::new(),
            runs,
        };
        for mode in MODES {
            let names: Vec<String> = s
                .runs
                .iter()
                .filter(|r| r.mode == mode)
                .flat_map(|r| r.figures.keys().cloned())
                .collect();
            let figures = names
                .into_iter()
                .filter_map(|n| spread(&s.values(mode, &n)).map(|sp| (n, sp)))
                .collect();
            s.modes.insert(mode.into(), figures);
        }
        s
    }

    fn find<'a>(verdicts: &'a [Verdict], rule: &str) -> &'a Verdict {
        verdicts
            .iter()
            .find(|v| v.rule.starts_with(rule))
            .expect("rule present")
    }

    const GOOD: &[(&str, f64)] = &[
        ("k6_exit", 0.0),
        ("p99_ms", 700.0),
        ("rss_start_mib", 10.0),
        ("rss_peak_mib", 20.0),
    ];

    #[test]
    fn goodput_needs_one_and_a_half_times_legacy() {
        let ok = summary(
            "goodput",
            &[
                ("legacy", &[("goodput_per_s", 40.0)]),
                ("propagate", &[("goodput_per_s", 81.0)]),
            ],
        );
        assert!(find(&check(&ok, 700.0, 50.0), "goodput").ok);
        let bad = summary(
            "goodput",
            &[
                ("legacy", &[("goodput_per_s", 60.0)]),
                ("propagate", &[("goodput_per_s", 81.0)]),
            ],
        );
        assert!(!find(&check(&bad, 700.0, 50.0), "goodput").ok);
    }

    #[test]
    fn k6_failure_p99_and_memory_fail_the_check() {
        let ok = summary("happy", &[("legacy", GOOD), ("propagate", GOOD)]);
        assert!(
            check(&ok, 700.0, 50.0).iter().all(|v| v.ok),
            "{:?}",
            check(&ok, 700.0, 50.0)
        );
        let bad = summary(
            "happy",
            &[
                ("legacy", GOOD),
                (
                    "propagate",
                    &[
                        ("k6_exit", 99.0),
                        ("p99_ms", 978.0),
                        ("rss_start_mib", 10.0),
                        ("rss_peak_mib", 60.0),
                    ],
                ),
            ],
        );
        let verdicts = check(&bad, 700.0, 100.0);
        assert!(!find(&verdicts, "k6").ok);
        assert!(!find(&verdicts, "propagate p99").ok);
        assert!(!find(&verdicts, "propagate memory").ok);
    }

    #[test]
    fn the_seed_run_must_show_legacy_queueing() {
        let queued = summary(
            "seed",
            &[
                ("legacy", &[("pending_peak", 200.0), ("p99_ms", 4000.0)]),
                ("propagate", GOOD),
            ],
        );
        assert!(find(&check(&queued, 700.0, 50.0), "legacy queues").ok);
        let flat = summary(
            "seed",
            &[
                ("legacy", &[("pending_peak", 0.0), ("p99_ms", 4000.0)]),
                ("propagate", GOOD),
            ],
        );
        assert!(!find(&check(&flat, 700.0, 50.0), "legacy queues").ok);
    }

    #[test]
    fn recovery_over_a_second_or_missing_fails() {
        let fast = summary(
            "recovery",
            &[("legacy", GOOD), ("propagate", &[("recovery_ms", 300.0)])],
        );
        assert!(find(&check(&fast, 700.0, 50.0), "propagate recovers").ok);
        let slow = summary(
            "recovery",
            &[("legacy", GOOD), ("propagate", &[("recovery_ms", 1200.0)])],
        );
        assert!(!find(&check(&slow, 700.0, 50.0), "propagate recovers").ok);
        let never = summary(
            "recovery",
            &[("legacy", GOOD), ("propagate", &[("k6_exit", 0.0)])],
        );
        assert!(!find(&check(&never, 700.0, 50.0), "propagate recovers").ok);
    }
}
