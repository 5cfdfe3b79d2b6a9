//! `--check`: the acceptance rules of docs/design.md §9 over a summary. Pure, so each rule is
//! unit-tested with made-up figures.
//!
//! Every rule fails on missing data. A figure a run did not produce (`NaN`), a mode with
//! no runs, or a legacy figure to compare against that is absent is a run that proved
//! nothing, and a check that passes on nothing would pass on a broken experiment.

use crate::diagnosis::{self, Answer};
use crate::summary::{MODES, Summary};

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

/// Every run's value of `figure` in `mode`, or `None` when there is no run or a run
/// lacks it: then the rule fails, naming what is missing.
fn every_run(summary: &Summary, mode: &str, figure: &str) -> Option<Vec<f64>> {
    let values = summary.values(mode, figure);
    (!values.is_empty() && values.iter().all(|v| v.is_finite())).then_some(values)
}

fn missing(rule: &str, mode: &str, figure: &str) -> Verdict {
    verdict(rule, false, format!("{figure} missing from a {mode} run"))
}

/// Every rule that applies to `summary`'s scenario. The rules of propagate apply to
/// every side that runs the technique, which is every side but `legacy`; the
/// scenario's own rules, which compare legacy with propagate, only when the sides are
/// the modes.
pub fn check(summary: &Summary, budget_ms: f64, margin_ms: f64) -> Vec<Verdict> {
    let mut verdicts = vec![k6_passed(summary)];
    for side in summary.sides.iter().filter(|s| *s != "legacy") {
        verdicts.extend([
            propagate_p99(summary, side, budget_ms + margin_ms),
            memory_flat(summary, side),
            pending_within_limit(summary, side),
            in_flight_drained(summary, side),
        ]);
    }
    if let Some(rules) = hedging_rules(summary) {
        verdicts.extend(rules);
        return verdicts;
    }
    if summary.sides != MODES {
        return verdicts;
    }
    match summary.scenario.as_str() {
        "goodput" => verdicts.push(goodput_ratio(summary)),
        "seed" => verdicts.push(legacy_queues(summary, budget_ms)),
        "recovery" => verdicts.push(recovered(summary)),
        "saturation" => verdicts.push(executor_saturated(summary, budget_ms)),
        "pool-queue" => verdicts.push(pool_queued(summary, budget_ms)),
        "partition" => verdicts.extend(partition_bounded(summary, budget_ms)),
        _ => {}
    }
    verdicts
}

/// k6 exits 0 in every run of both modes: no unexpected status, propagate's p99
/// threshold held.
fn k6_passed(summary: &Summary) -> Verdict {
    const RULE: &str = "k6 exit code";
    if let Some(mode) = summary
        .sides
        .iter()
        .find(|m| summary.values(m, "k6_exit").is_empty())
    {
        return verdict(RULE, false, format!("no {mode} run"));
    }
    let failed: Vec<String> = summary
        .runs
        .iter()
        .filter(|r| r.figures.get("k6_exit") != Some(&0.0))
        .map(|r| match r.figures.get("k6_exit") {
            Some(code) => format!("{} #{}: {code}", r.mode, r.repeat),
            None => format!("{} #{}: no exit code", r.mode, r.repeat),
        })
        .collect();
    let detail = if failed.is_empty() {
        "every run exited 0".to_owned()
    } else {
        failed.join(", ")
    };
    verdict(RULE, failed.is_empty(), detail)
}

/// Propagate answers within the budget plus the margin, at p99, in every run.
fn propagate_p99(summary: &Summary, side: &str, limit_ms: f64) -> Verdict {
    let rule = &format!("{side} p99 within budget + margin");
    let Some(p99s) = every_run(summary, side, "p99_ms") else {
        return missing(rule, side, "p99_ms");
    };
    let worst = p99s.into_iter().fold(f64::MIN, f64::max);
    verdict(
        rule,
        worst <= limit_ms,
        format!("worst p99 {worst:.0} ms, limit {limit_ms:.0} ms"),
    )
}

/// orders-service's memory stays flat under load in propagate mode.
fn memory_flat(summary: &Summary, side: &str) -> Verdict {
    let rule = &format!("{side} memory flat");
    let (Some(starts), Some(peaks)) = (
        every_run(summary, side, "rss_start_mib"),
        every_run(summary, side, "rss_peak_mib"),
    ) else {
        return missing(rule, side, "rss_start_mib or rss_peak_mib");
    };
    let growth = starts
        .iter()
        .zip(&peaks)
        .map(|(s, p)| p - s)
        .fold(f64::MIN, f64::max);
    verdict(
        rule,
        growth <= MAX_RSS_GROWTH_MIB,
        format!("largest RSS growth {growth:.1} MiB, limit {MAX_RSS_GROWTH_MIB} MiB"),
    )
}

/// Propagate's catalog calls never queue past the bulkhead's limit, in any run.
fn pending_within_limit(summary: &Summary, side: &str) -> Verdict {
    let rule = &format!("{side} pending within its limit");
    let (Some(peaks), Some(limits)) = (
        every_run(summary, side, "pending_peak"),
        every_run(summary, side, "pending_limit"),
    ) else {
        return missing(rule, side, "pending_peak or pending_limit");
    };
    let over: Vec<String> = peaks
        .iter()
        .zip(&limits)
        .filter(|(peak, limit)| peak > limit)
        .map(|(peak, limit)| format!("{peak:.0} > {limit:.0}"))
        .collect();
    let worst = peaks.iter().copied().fold(f64::MIN, f64::max);
    let detail = match over.is_empty() {
        true => format!("peak {worst:.0}, limit {:.0}", limits[0]),
        false => format!("peak over the limit: {}", over.join(", ")),
    };
    verdict(rule, over.is_empty(), detail)
}

/// Once the load stops, propagate's in-flight orders go back to zero in every run.
fn in_flight_drained(summary: &Summary, side: &str) -> Verdict {
    let rule = &format!("{side} in-flight back to zero");
    let Some(ends) = every_run(summary, side, "in_flight_end") else {
        return missing(rule, side, "in_flight_end");
    };
    let left = ends.iter().copied().fold(0.0, f64::max);
    let drain = summary
        .values(side, "drain_ms")
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    verdict(
        rule,
        left == 0.0,
        format!("{left:.0} still in flight after the drain (slowest drain {drain:.0} ms)"),
    )
}

/// The headline: propagate serves at least 1.5 times legacy's goodput.
fn goodput_ratio(summary: &Summary) -> Verdict {
    const RULE: &str = "goodput propagate / legacy";
    let median = |mode| summary.get(mode, "goodput_per_s").map(|s| s.median);
    let (Some(legacy), Some(propagate)) = (median("legacy"), median("propagate")) else {
        return verdict(RULE, false, "goodput_per_s missing from a mode".to_owned());
    };
    // A legacy that served nothing in budget makes any propagate goodput infinitely
    // better; only a figure that is absent is no comparison at all.
    let ratio = if legacy > 0.0 {
        propagate / legacy
    } else {
        f64::INFINITY
    };
    verdict(
        RULE,
        ratio >= MIN_GOODPUT_RATIO && propagate > 0.0,
        format!("{propagate:.1} / {legacy:.1} orders/s = {ratio:.2}, at least {MIN_GOODPUT_RATIO}"),
    )
}

/// The seed's run shows the "before": legacy queues (pending calls, p99 past the budget).
fn legacy_queues(summary: &Summary, budget_ms: f64) -> Verdict {
    const RULE: &str = "legacy queues in the seed's run";
    let median = |figure| summary.get("legacy", figure).map(|s| s.median);
    let (Some(pending), Some(p99)) = (median("pending_peak"), median("p99_ms")) else {
        return missing(RULE, "legacy", "pending_peak or p99_ms");
    };
    verdict(
        RULE,
        pending > 0.0 && p99 > budget_ms,
        format!("legacy pending peak {pending:.0}, p99 {p99:.0} ms (budget {budget_ms:.0} ms)"),
    )
}

/// The saturation run shows the third answer: in every run of both modes the metrics
/// alone say the catalog's executor is saturated, and the pool's queue stays short.
fn executor_saturated(summary: &Summary, budget_ms: f64) -> Verdict {
    every_run_answers(
        summary,
        budget_ms,
        "the metrics say: saturated executor (catalog-service)",
        |answer, pending| {
            matches!(answer, Answer::SaturatedExecutor(s) if s.contains(&"catalog-service"))
                // A missing (NaN) mean is no flat pool.
                && pending < diagnosis::QUEUED_PENDING_MEAN
        },
        "catalog_busy_ratio",
    )
}

/// The pool-queue run shows the first answer: in every run of both modes the metrics
/// alone say calls wait for a slot while the downstream answers at its normal speed.
fn pool_queued(summary: &Summary, budget_ms: f64) -> Verdict {
    every_run_answers(
        summary,
        budget_ms,
        "the metrics say: pool queue",
        |answer, _| *answer == Answer::PoolQueue,
        "pending_mean",
    )
}

/// `rule` holds when both modes ran and `expected(answer, pending_mean)` holds for the
/// answer of every run; the detail names each run that broke it, or else propagate's
/// median of `shown`.
fn every_run_answers(
    summary: &Summary,
    budget_ms: f64,
    rule: &str,
    expected: impl Fn(&Answer, f64) -> bool,
    shown: &str,
) -> Verdict {
    let mut wrong = Vec::new();
    for mode in MODES {
        if summary.values(mode, "k6_exit").is_empty() {
            wrong.push(format!("no {mode} run"));
        }
    }
    for run in &summary.runs {
        let answer = diagnosis::answer(&run.figures, budget_ms);
        let pending = run.figures.get("pending_mean").copied().unwrap_or(f64::NAN);
        if !expected(&answer, pending) {
            wrong.push(format!(
                "{} #{}: {answer}, pool pending mean {pending:.1}",
                run.mode, run.repeat
            ));
        }
    }
    let detail = match wrong.is_empty() {
        true => format!(
            "every run; propagate's {shown} {}",
            summary
                .get("propagate", shown)
                .map_or("-".to_owned(), |s| format!("{:.2}", s.median))
        ),
        false => wrong.join("; "),
    };
    verdict(rule, wrong.is_empty(), detail)
}

/// Propagate serves a whole second in budget within 1 s of the fault going away.
fn recovered(summary: &Summary) -> Verdict {
    const RULE: &str = "propagate recovers within 1 s";
    let Some(times) = every_run(summary, "propagate", "recovery_ms") else {
        return verdict(
            RULE,
            false,
            "a propagate run never served a whole second in budget again".to_owned(),
        );
    };
    let worst = times.into_iter().fold(f64::MIN, f64::max);
    verdict(
        RULE,
        worst <= MAX_RECOVERY_MS,
        format!("slowest recovery {worst:.0} ms, limit {MAX_RECOVERY_MS:.0} ms"),
    )
}

/// `stragglers`: how much lower hedging must bring the p99.9 (0.1: 90 % lower).
pub const MAX_P999_RATIO: f64 = 0.1;
/// `stragglers`: the most catalog calls per order hedging may add, as a ratio.
pub const MAX_CALLS_RATIO: f64 = 1.02;
/// `stragglers`: the least goodput with hedging, as a share of without (a percent of
/// run-to-run noise).
pub const MIN_GOODPUT_WITH_HEDGING: f64 = 0.99;
/// `tight`: the most attempts cut by the deadline the rule may leave, as a share of the
/// deadline-blind variant's.
pub const MAX_CUT_RATIO: f64 = 0.1;
/// `tight`: how many fewer orders in time the rule may answer, as a share of orders.
pub const MAX_IN_TIME_LOSS: f64 = 0.005;
/// `outage`: the most catalog calls per order while the catalog refuses everything.
pub const MAX_OUTAGE_CALLS_PER_ORDER: f64 = 1.05;

/// The median of `figure` over `side`'s runs, or a verdict saying it is missing.
fn median_of(summary: &Summary, rule: &str, side: &str, figure: &str) -> Result<f64, Verdict> {
    every_run(summary, side, figure)
        .and_then(|values| crate::stats::spread(&values))
        .map(|s| s.median)
        .ok_or_else(|| missing(rule, side, figure))
}

/// The rules of the hedging scenarios, each comparing its own two sides: `stragglers`
/// and `outage` hedging off against on, `tight` the deadline rule off against on.
/// `None` for any other scenario or pair of sides.
fn hedging_rules(summary: &Summary) -> Option<Vec<Verdict>> {
    let sides: Vec<&str> = summary.sides.iter().map(String::as_str).collect();
    let ratio_rule = |rule: &str,
                      figure: &str,
                      [a, b]: [&str; 2],
                      holds: &dyn Fn(f64, f64) -> bool,
                      show: &dyn Fn(f64, f64) -> String| {
        match (
            median_of(summary, rule, a, figure),
            median_of(summary, rule, b, figure),
        ) {
            (Ok(x), Ok(y)) => verdict(rule, holds(x, y), show(x, y)),
            (Err(v), _) | (_, Err(v)) => v,
        }
    };
    match (summary.scenario.as_str(), sides.as_slice()) {
        ("stragglers", ["hedging-off", "hedging-on"]) => {
            let pair = ["hedging-off", "hedging-on"];
            Some(vec![
                ratio_rule(
                    "hedging cuts the p99.9 by 90 %",
                    "p999_ms",
                    pair,
                    &|off, on| on <= MAX_P999_RATIO * off,
                    &|off, on| format!("p99.9 {off:.0} ms off, {on:.0} ms on ({:.2})", on / off),
                ),
                ratio_rule(
                    "hedging adds at most 2 % catalog attempts",
                    "attempts_per_order",
                    pair,
                    &|off, on| on <= MAX_CALLS_RATIO * off,
                    &|off, on| {
                        format!("{off:.4} off, {on:.4} on calls per order ({:.3})", on / off)
                    },
                ),
                ratio_rule(
                    "hedging lowers no goodput",
                    "goodput_per_s",
                    pair,
                    &|off, on| on >= MIN_GOODPUT_WITH_HEDGING * off,
                    &|off, on| format!("{off:.1} off, {on:.1} on orders/s"),
                ),
            ])
        }
        ("tight", ["deadline-blind", "deadline-aware"]) => {
            let pair = ["deadline-blind", "deadline-aware"];
            Some(vec![
                ratio_rule(
                    "the deadline rule leaves 90 % fewer extra attempts cut",
                    "extra_attempts_cut_per_s",
                    pair,
                    &|blind, aware| aware <= MAX_CUT_RATIO * blind,
                    &|blind, aware| format!("{blind:.2}/s blind, {aware:.2}/s aware"),
                ),
                ratio_rule(
                    "the deadline rule costs at most 0.5 points of orders in time",
                    "in_time_share",
                    pair,
                    &|blind, aware| aware >= blind - MAX_IN_TIME_LOSS,
                    &|blind, aware| {
                        format!("{:.2} % blind, {:.2} % aware", blind * 100.0, aware * 100.0)
                    },
                ),
            ])
        }
        ("outage", ["hedging-off", "hedging-on"]) => Some(
            ["hedging-off", "hedging-on"]
                .iter()
                .map(|side| {
                    let rule =
                        &format!("{side}: at most 1.05 catalog calls per order in the outage");
                    match every_run(summary, side, "outage_calls_per_order") {
                        Some(values) => {
                            let worst = values.into_iter().fold(f64::MIN, f64::max);
                            verdict(
                                rule,
                                worst <= MAX_OUTAGE_CALLS_PER_ORDER,
                                format!("at most {worst:.3}"),
                            )
                        }
                        None => missing(rule, side, "outage_calls_per_order"),
                    }
                })
                .collect(),
        ),
        _ => None,
    }
}

/// How much of its goodput before the cut propagate must have back after the heal.
pub const MIN_GOODPUT_AFTER_HEAL: f64 = 0.9;
/// How long past the budget a transaction of propagate may hold its row locks on the
/// server while the link is cut (the session bounds' time, docs/design.md §5).
pub const MAX_LOCK_HOLD_PAST_BUDGET_MS: f64 = 1000.0;

/// `partition`: propagate's transactions hold their locks no longer than the budget plus
/// a second whatever the network does; no transaction of either mode survives the heal;
/// propagate's goodput comes back.
fn partition_bounded(summary: &Summary, budget_ms: f64) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    let rule = "propagate holds row locks no longer than budget + 1 s during the cut";
    let limit = budget_ms + MAX_LOCK_HOLD_PAST_BUDGET_MS;
    verdicts.push(
        match every_run(summary, "propagate", "longest_write_xact_ms") {
            Some(holds) => {
                let worst = holds.into_iter().fold(f64::MIN, f64::max);
                verdict(
                    rule,
                    worst <= limit,
                    format!("longest {worst:.0} ms, limit {limit:.0} ms"),
                )
            }
            None => missing(rule, "propagate", "longest_write_xact_ms"),
        },
    );
    for side in MODES {
        let rule = &format!("{side}: no transaction left without a client after the heal");
        verdicts.push(
            match every_run(summary, side, "clientless_xacts_after_heal") {
                Some(left) => {
                    let worst = left.into_iter().fold(f64::MIN, f64::max);
                    verdict(rule, worst == 0.0, format!("at most {worst:.0} left"))
                }
                None => missing(rule, side, "clientless_xacts_after_heal"),
            },
        );
    }
    let rule = "propagate's goodput comes back after the heal";
    let before = every_run(summary, "propagate", "goodput_before_cut_per_s");
    let after = every_run(summary, "propagate", "goodput_after_heal_per_s");
    verdicts.push(match (before, after) {
        (Some(before), Some(after)) => {
            let worst = before
                .iter()
                .zip(&after)
                .map(|(b, a)| if *b > 0.0 { a / b } else { 0.0 })
                .fold(f64::MAX, f64::min);
            verdict(
                rule,
                worst >= MIN_GOODPUT_AFTER_HEAL,
                format!("after / before at least {worst:.2}, limit {MIN_GOODPUT_AFTER_HEAL}"),
            )
        }
        _ => missing(
            rule,
            "propagate",
            "goodput_before_cut_per_s or goodput_after_heal_per_s",
        ),
    });
    verdicts
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
            sides: MODES.map(str::to_owned).to_vec(),
            answers: BTreeMap::new(),
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
        ("pending_peak", 50.0),
        ("pending_limit", 50.0),
        ("in_flight_end", 0.0),
    ];

    /// `GOOD` with `figure` set to `value`, or left out when `value` is `None`.
    fn good_but(figure: &str, value: Option<f64>) -> Vec<(&'static str, f64)> {
        let mut figures: Vec<(&'static str, f64)> =
            GOOD.iter().copied().filter(|(f, _)| *f != figure).collect();
        if let Some(value) = value {
            let name = GOOD
                .iter()
                .find(|(f, _)| *f == figure)
                .expect("a GOOD figure")
                .0;
            figures.push((name, value));
        }
        figures
    }

    /// Each rule over a propagate run that lacks its figure, or has `NaN` for it.
    fn fails_without(rule: &str, figure: &str) {
        for value in [None, Some(f64::NAN)] {
            let figures = good_but(figure, value);
            let s = summary("happy", &[("legacy", GOOD), ("propagate", &figures)]);
            let v = find(&check(&s, 700.0, 100.0), rule).clone();
            assert!(
                !v.ok,
                "{rule} passed with {figure} = {value:?}: {}",
                v.detail
            );
        }
    }

    #[test]
    fn every_rule_holds_on_good_figures() {
        let s = summary("happy", &[("legacy", GOOD), ("propagate", GOOD)]);
        let verdicts = check(&s, 700.0, 100.0);
        assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
        assert_eq!(verdicts.len(), 5);
    }

    #[test]
    fn a_missing_figure_fails_its_rule() {
        fails_without("k6", "k6_exit");
        fails_without("propagate p99", "p99_ms");
        fails_without("propagate memory", "rss_start_mib");
        fails_without("propagate memory", "rss_peak_mib");
        fails_without("propagate pending", "pending_peak");
        fails_without("propagate pending", "pending_limit");
        fails_without("propagate in-flight", "in_flight_end");
    }

    #[test]
    fn a_mode_without_runs_fails_the_check() {
        let s = summary("happy", &[("propagate", GOOD)]);
        assert!(!find(&check(&s, 700.0, 100.0), "k6").ok, "no legacy run");
        let s = summary("happy", &[("legacy", GOOD)]);
        let verdicts = check(&s, 700.0, 100.0);
        for rule in [
            "k6",
            "propagate p99",
            "propagate memory",
            "propagate pending",
        ] {
            assert!(
                !find(&verdicts, rule).ok,
                "{rule} passed with no propagate run"
            );
        }
    }

    #[test]
    fn pending_over_its_limit_or_orders_left_in_flight_fail() {
        for (figure, value, rule) in [
            ("pending_peak", 51.0, "propagate pending"),
            ("in_flight_end", 3.0, "propagate in-flight"),
        ] {
            let figures = good_but(figure, Some(value));
            let s = summary("happy", &[("legacy", GOOD), ("propagate", &figures)]);
            assert!(
                !find(&check(&s, 700.0, 100.0), rule).ok,
                "{figure} = {value}"
            );
        }
    }

    #[test]
    fn goodput_without_a_legacy_figure_fails_but_a_legacy_zero_counts() {
        let missing = summary(
            "goodput",
            &[("legacy", GOOD), ("propagate", &[("goodput_per_s", 81.0)])],
        );
        assert!(!find(&check(&missing, 700.0, 100.0), "goodput").ok);
        let nan = summary(
            "goodput",
            &[
                ("legacy", &[("goodput_per_s", f64::NAN)]),
                ("propagate", &[("goodput_per_s", 81.0)]),
            ],
        );
        assert!(!find(&check(&nan, 700.0, 100.0), "goodput").ok);
        let zero = summary(
            "goodput",
            &[
                ("legacy", &[("goodput_per_s", 0.0)]),
                ("propagate", &[("goodput_per_s", 81.0)]),
            ],
        );
        assert!(find(&check(&zero, 700.0, 100.0), "goodput").ok);
    }

    #[test]
    fn the_seed_check_fails_without_legacy_figures() {
        let s = summary(
            "seed",
            &[("legacy", &[("k6_exit", 0.0)]), ("propagate", GOOD)],
        );
        let v = find(&check(&s, 700.0, 100.0), "legacy queues").clone();
        assert!(!v.ok);
        assert!(v.detail.contains("missing"), "{}", v.detail);
    }

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

    const SATURATED: &[(&str, f64)] = &[
        ("k6_exit", 0.0),
        ("orders_busy_ratio", 0.1),
        ("catalog_busy_ratio", 0.98),
        ("catalog_call_mean_ms", 300.0),
        ("pending_mean", 0.0),
    ];

    #[test]
    fn the_saturation_run_must_read_as_the_catalogs_saturated_executor_in_every_run() {
        let rule = "the metrics say";
        let ok = summary(
            "saturation",
            &[("legacy", SATURATED), ("propagate", SATURATED)],
        );
        let v = find(&check(&ok, 700.0, 50.0), rule).clone();
        assert!(v.ok, "{}", v.detail);
        // A slow downstream is not it; nor is a saturation with a queued pool.
        for (figure, value) in [("catalog_busy_ratio", 0.5), ("pending_mean", 12.0)] {
            let mut figures = SATURATED.to_vec();
            figures.retain(|(f, _)| *f != figure);
            figures.push((figure, value));
            let bad = summary(
                "saturation",
                &[("legacy", SATURATED), ("propagate", &figures)],
            );
            let v = find(&check(&bad, 700.0, 50.0), rule).clone();
            assert!(!v.ok, "{figure} = {value}: {}", v.detail);
            assert!(v.detail.contains("propagate #"), "{}", v.detail);
        }
        // No runtime figure, or no legacy run: no pass.
        let unknown = summary(
            "saturation",
            &[("legacy", SATURATED), ("propagate", &[("k6_exit", 0.0)])],
        );
        assert!(!find(&check(&unknown, 700.0, 50.0), rule).ok);
        let one_mode = summary("saturation", &[("propagate", SATURATED)]);
        let v = find(&check(&one_mode, 700.0, 50.0), rule).clone();
        assert!(!v.ok && v.detail.contains("no legacy run"), "{}", v.detail);
    }

    const QUEUED: &[(&str, f64)] = &[
        ("k6_exit", 0.0),
        ("orders_busy_ratio", 0.1),
        ("catalog_busy_ratio", 0.05),
        ("catalog_call_mean_ms", 21.0),
        ("pending_mean", 27.0),
    ];

    #[test]
    fn the_pool_queue_run_must_read_as_a_pool_queue_in_every_run() {
        let rule = "the metrics say: pool queue";
        let ok = summary("pool-queue", &[("legacy", QUEUED), ("propagate", QUEUED)]);
        let v = find(&check(&ok, 700.0, 50.0), rule).clone();
        assert!(v.ok, "{}", v.detail);
        // A slow call, a saturated executor, or no queue: not a pool queue.
        for (figure, value) in [
            ("catalog_call_mean_ms", 300.0),
            ("orders_busy_ratio", 0.95),
            ("pending_mean", 0.2),
        ] {
            let mut figures = QUEUED.to_vec();
            figures.retain(|(f, _)| *f != figure);
            figures.push((figure, value));
            let bad = summary("pool-queue", &[("legacy", &figures), ("propagate", QUEUED)]);
            let v = find(&check(&bad, 700.0, 50.0), rule).clone();
            assert!(!v.ok, "{figure} = {value}: {}", v.detail);
            assert!(v.detail.contains("legacy #"), "{}", v.detail);
        }
        let one_mode = summary("pool-queue", &[("legacy", QUEUED)]);
        let v = find(&check(&one_mode, 700.0, 50.0), rule).clone();
        assert!(
            !v.ok && v.detail.contains("no propagate run"),
            "{}",
            v.detail
        );
    }

    #[test]
    fn other_sides_than_the_modes_each_get_the_propagate_rules_and_no_scenario_rule() {
        let mut s = summary("goodput", &[("legacy", GOOD), ("propagate", GOOD)]);
        for run in &mut s.runs {
            run.mode = if run.mode == "legacy" {
                "metrics-off"
            } else {
                "metrics-on"
            }
            .into();
        }
        s.sides = vec!["metrics-off".into(), "metrics-on".into()];
        s.modes = BTreeMap::from([
            ("metrics-off".into(), s.modes["legacy"].clone()),
            ("metrics-on".into(), s.modes["propagate"].clone()),
        ]);
        let verdicts = check(&s, 700.0, 100.0);
        assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
        assert_eq!(
            verdicts.len(),
            9,
            "k6 and four rules per side: {verdicts:?}"
        );
        assert!(find(&verdicts, "metrics-off p99").ok);
        assert!(verdicts.iter().all(|v| !v.rule.starts_with("goodput")));
    }

    #[test]
    fn a_partition_passes_with_locks_bounded_no_ghost_after_the_heal_and_goodput_back() {
        let mut good: Vec<(&str, f64)> = GOOD.to_vec();
        good.extend([
            ("longest_write_xact_ms", 1500.0),
            ("clientless_xacts_after_heal", 0.0),
            ("goodput_before_cut_per_s", 80.0),
            ("goodput_after_heal_per_s", 78.0),
        ]);
        let s = summary("partition", &[("legacy", &good), ("propagate", &good)]);
        let verdicts = check(&s, 700.0, 50.0);
        assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");

        let with = |figure: &str, value: f64| -> Vec<(&str, f64)> {
            good.iter()
                .map(|&(f, v)| (f, if f == figure { value } else { v }))
                .collect()
        };
        let held_too_long = with("longest_write_xact_ms", 20_000.0);
        let s = summary(
            "partition",
            &[("legacy", &good), ("propagate", &held_too_long)],
        );
        assert!(!find(&check(&s, 700.0, 50.0), "propagate holds row locks").ok);
        let ghost = with("clientless_xacts_after_heal", 1.0);
        let s = summary("partition", &[("legacy", &ghost), ("propagate", &good)]);
        assert!(!find(&check(&s, 700.0, 50.0), "legacy: no transaction left").ok);
        let slow_back = with("goodput_after_heal_per_s", 40.0);
        let s = summary("partition", &[("legacy", &good), ("propagate", &slow_back)]);
        assert!(!find(&check(&s, 700.0, 50.0), "propagate's goodput comes back").ok);

        let s = summary("partition", &[("legacy", GOOD), ("propagate", GOOD)]);
        let verdicts = check(&s, 700.0, 50.0);
        assert_eq!(
            verdicts.iter().filter(|v| !v.ok).count(),
            4,
            "every partition rule fails on missing figures: {verdicts:?}"
        );
    }

    /// A summary of `scenario` with `sides`, one run each, `GOOD` plus `a`'s and `b`'s
    /// own figures.
    fn versus(
        scenario: &str,
        sides: [&str; 2],
        a: &[(&'static str, f64)],
        b: &[(&'static str, f64)],
    ) -> Summary {
        fn with(own: &[(&'static str, f64)]) -> Vec<(&'static str, f64)> {
            GOOD.iter().chain(own).copied().collect()
        }
        let (a, b) = (with(a), with(b));
        let mut s = summary(scenario, &[("legacy", &a), ("propagate", &b)]);
        for run in &mut s.runs {
            run.mode = if run.mode == "legacy" {
                sides[0]
            } else {
                sides[1]
            }
            .into();
        }
        s.sides = sides.map(str::to_owned).to_vec();
        s.modes = BTreeMap::from([
            (sides[0].into(), s.modes["legacy"].clone()),
            (sides[1].into(), s.modes["propagate"].clone()),
        ]);
        s
    }

    #[test]
    fn the_hedging_scenarios_hold_their_targets_and_fail_past_them() {
        let sides = ["hedging-off", "hedging-on"];
        let off = [
            ("p999_ms", 1000.0),
            ("attempts_per_order", 1.0),
            ("goodput_per_s", 190.0),
        ];
        let on = [
            ("p999_ms", 60.0),
            ("attempts_per_order", 1.015),
            ("goodput_per_s", 191.0),
        ];
        let verdicts = check(&versus("stragglers", sides, &off, &on), 700.0, 50.0);
        assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
        let costly = [
            ("p999_ms", 60.0),
            ("attempts_per_order", 1.05),
            ("goodput_per_s", 191.0),
        ];
        let verdicts = check(&versus("stragglers", sides, &off, &costly), 700.0, 50.0);
        assert!(!find(&verdicts, "hedging adds at most 2 %").ok);

        let sides = ["deadline-blind", "deadline-aware"];
        let blind = [("extra_attempts_cut_per_s", 5.0), ("in_time_share", 0.95)];
        let aware = [("extra_attempts_cut_per_s", 0.3), ("in_time_share", 0.948)];
        let verdicts = check(&versus("tight", sides, &blind, &aware), 700.0, 50.0);
        assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
        let worse = [("extra_attempts_cut_per_s", 0.3), ("in_time_share", 0.94)];
        let verdicts = check(&versus("tight", sides, &blind, &worse), 700.0, 50.0);
        assert!(!find(&verdicts, "the deadline rule costs").ok);

        let sides = ["hedging-off", "hedging-on"];
        let verdicts = check(
            &versus(
                "outage",
                sides,
                &[("outage_calls_per_order", 1.04)],
                &[("outage_calls_per_order", 1.06)],
            ),
            700.0,
            50.0,
        );
        assert!(find(&verdicts, "hedging-off: at most 1.05").ok);
        assert!(!find(&verdicts, "hedging-on: at most 1.05").ok);
        // Missing figures fail.
        let verdicts = check(&versus("outage", sides, &[], &[]), 700.0, 50.0);
        assert!(!find(&verdicts, "hedging-off: at most 1.05").ok);
    }
}
