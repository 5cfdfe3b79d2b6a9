//! `--check`: the acceptance rules of docs/design.md §9 over a summary. Pure, so each rule is
//! unit-tested with made-up figures.
//!
//! Every rule fails on missing data. A figure a run did not produce (`NaN`), a mode with
//! no runs, or a legacy figure to compare against that is absent is a run that proved
//! nothing, and a check that passes on nothing would pass on a broken experiment.

use crate::diagnosis::{self, Answer};
use crate::stats::spread;
use crate::summary::{MODES, Summary};

/// `goodput`, `pricing-slow`: propagate's least goodput, as a multiple of legacy's.
pub const MIN_GOODPUT_RATIO: f64 = 1.5;
/// The most orders-service's memory may grow during a propagate load, MiB.
pub const MAX_RSS_GROWTH_MIB: f64 = 32.0;
/// The longest propagate may take to serve a whole second in budget after the fault.
pub const MAX_RECOVERY_MS: f64 = 1000.0;
/// `stragglers`: how much lower hedging must bring the p99.9 (0.1: 90 % lower).
pub const MAX_P999_RATIO: f64 = 0.1;
/// `stragglers`: the most catalog calls per order hedging may add, as a ratio.
pub const MAX_CALLS_RATIO: f64 = 1.02;
/// `stragglers`: the least goodput with hedging, as a share of without (noise allowed).
pub const MIN_GOODPUT_WITH_HEDGING: f64 = 0.99;
/// `tight`: the most attempts cut the rule may leave, as a share of the blind variant's.
pub const MAX_CUT_RATIO: f64 = 0.1;
/// `tight`: how many fewer orders in time the rule may answer, as a share of orders.
pub const MAX_IN_TIME_LOSS: f64 = 0.005;
/// `outage`: the most catalog calls per order while the catalog refuses everything.
pub const MAX_OUTAGE_CALLS_PER_ORDER: f64 = 1.05;
/// The three-hop scenarios: the most of a hop's answers that may leave later than its
/// own deadline plus 10 ms (0.01: its p99 is within it).
pub const MAX_HOP_LATE_SHARE: f64 = 0.01;
/// `pricing-down`: the most pricing calls per order when one layer owns retries.
pub const MAX_PRICING_CALLS_PER_ORDER: f64 = 1.1;
/// `partition`: the share of its goodput before the cut propagate has back after the heal.
pub const MIN_GOODPUT_AFTER_HEAL: f64 = 0.9;
/// `partition`: how long past the budget a transaction of propagate may hold its row
/// locks on the server while the link is cut (the session bounds' time, docs/design.md §5).
pub const MAX_LOCK_HOLD_PAST_BUDGET_MS: f64 = 1000.0;

/// One rule's outcome: whether it held, and the numbers behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub rule: String,
    pub ok: bool,
    pub detail: String,
}

fn verdict(rule: &str, ok: bool, detail: String) -> Verdict {
    Verdict {
        rule: rule.to_owned(),
        ok,
        detail,
    }
}

/// Per run of `side`, its `figures`; or `rule` failed when there is no run or one lacks one.
fn runs(
    summary: &Summary,
    rule: &str,
    side: &str,
    figures: &[&str],
) -> Result<Vec<Vec<f64>>, Verdict> {
    let rows: Vec<Vec<f64>> = summary
        .runs
        .iter()
        .filter(|r| r.mode == side)
        .map(|r| {
            let value = |f: &&str| r.figures.get(*f).copied().unwrap_or(f64::NAN);
            figures.iter().map(value).collect()
        })
        .collect();
    if rows.is_empty() || rows.iter().flatten().any(|v| !v.is_finite()) {
        let missing = figures.join(" or ");
        return Err(verdict(
            rule,
            false,
            format!("{missing} missing from a {side} run"),
        ));
    }
    Ok(rows)
}

/// `rule` holds when every run of `side` has `figure` and the largest is at most `limit`.
fn at_most(
    summary: &Summary,
    rule: &str,
    side: &str,
    (figure, limit): (&str, f64),
    detail: impl Fn(f64) -> String,
) -> Verdict {
    match runs(summary, rule, side, &[figure]) {
        Ok(rows) => {
            let worst = rows.iter().map(|r| r[0]).fold(f64::MIN, f64::max);
            verdict(rule, worst <= limit, detail(worst))
        }
        Err(missing) => missing,
    }
}

/// Every rule that applies to `summary`'s scenario: propagate's on every side but
/// `legacy`; the scenario's own, comparing legacy with propagate, when the sides are those.
pub fn check(summary: &Summary, budget_ms: f64, margin_ms: f64) -> Vec<Verdict> {
    let mut verdicts = vec![k6_passed(summary)];
    for side in summary.sides.iter().filter(|s| *s != "legacy") {
        verdicts.extend(propagate_rules(summary, side, budget_ms + margin_ms));
        if summary.scenario.starts_with("pricing-") {
            verdicts.extend(hops_in_time(summary, side));
        }
    }
    // The side on which one layer owns retries, where there is one.
    let owner = summary
        .sides
        .iter()
        .find(|s| *s == "propagate" || *s == "one-hop");
    if let (Some(owner), "pricing-down") = (owner, summary.scenario.as_str()) {
        let rule =
            format!("{owner}: at most {MAX_PRICING_CALLS_PER_ORDER} pricing calls per order");
        let limit = ("pricing_calls_per_order", MAX_PRICING_CALLS_PER_ORDER);
        verdicts.push(at_most(summary, &rule, owner, limit, |worst| {
            format!("at most {worst:.3}")
        }));
    }
    if let Some(rules) = hedging_rules(summary) {
        verdicts.extend(rules);
        return verdicts;
    }
    if summary.sides != MODES {
        return verdicts;
    }
    match summary.scenario.as_str() {
        "goodput" | "pricing-slow" => verdicts.push(goodput_ratio(summary)),
        "seed" => verdicts.push(legacy_queues(summary, budget_ms)),
        "recovery" => verdicts.push(recovered(summary)),
        "saturation" => verdicts.push(executor_saturated(summary, budget_ms)),
        "pool-queue" => verdicts.push(pool_queued(summary, budget_ms)),
        "partition" => verdicts.extend(partition_bounded(summary, budget_ms)),
        _ => {}
    }
    verdicts
}

/// k6 exits 0 in every run: no unexpected status, propagate's p99 threshold held.
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
    let detail = match failed.is_empty() {
        true => "every run exited 0".to_owned(),
        false => failed.join(", "),
    };
    verdict(RULE, failed.is_empty(), detail)
}

/// The technique's own rules, in every run of `side`: p99 within budget + margin, memory
/// flat, the pool's queue within its limit, no order in flight once the load stops.
fn propagate_rules(summary: &Summary, side: &str, limit_ms: f64) -> [Verdict; 4] {
    let p99 = at_most(
        summary,
        &format!("{side} p99 within budget + margin"),
        side,
        ("p99_ms", limit_ms),
        |worst| format!("worst p99 {worst:.0} ms, limit {limit_ms:.0} ms"),
    );
    let rule = &format!("{side} memory flat");
    let memory = runs(summary, rule, side, &["rss_start_mib", "rss_peak_mib"]).map(|rows| {
        let growth = rows.iter().map(|r| r[1] - r[0]).fold(f64::MIN, f64::max);
        let detail = format!("largest RSS growth {growth:.1} MiB, limit {MAX_RSS_GROWTH_MIB} MiB");
        verdict(rule, growth <= MAX_RSS_GROWTH_MIB, detail)
    });
    let rule = &format!("{side} pending within its limit");
    let pending = runs(summary, rule, side, &["pending_peak", "pending_limit"]).map(|rows| {
        let over: Vec<String> = rows
            .iter()
            .filter(|r| r[0] > r[1])
            .map(|r| format!("{:.0} > {:.0}", r[0], r[1]))
            .collect();
        let worst = rows.iter().map(|r| r[0]).fold(f64::MIN, f64::max);
        let detail = match over.is_empty() {
            true => format!("peak {worst:.0}, limit {:.0}", rows[0][1]),
            false => format!("peak over the limit: {}", over.join(", ")),
        };
        verdict(rule, over.is_empty(), detail)
    });
    let drain = summary
        .values(side, "drain_ms")
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let in_flight = at_most(
        summary,
        &format!("{side} in-flight back to zero"),
        side,
        ("in_flight_end", 0.0),
        |left| format!("{left:.0} still in flight after the drain (slowest drain {drain:.0} ms)"),
    );
    [
        p99,
        memory.unwrap_or_else(|v| v),
        pending.unwrap_or_else(|v| v),
        in_flight,
    ]
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

/// Three hops: each of `side` answers by its deadline + 10 ms at p99 (its own metric).
fn hops_in_time(summary: &Summary, side: &str) -> Vec<Verdict> {
    crate::sampler::HOPS
        .iter()
        .map(|hop| {
            let rule = format!("{side}: {hop} answers by its deadline + 10 ms at p99");
            let figure = format!("{hop}_late_share");
            at_most(
                summary,
                &rule,
                side,
                (&figure, MAX_HOP_LATE_SHARE),
                |worst| format!("at most {:.2} % later", worst * 100.0),
            )
        })
        .collect()
}

/// The seed's run shows the "before": legacy queues (pending calls, p99 past the budget).
fn legacy_queues(summary: &Summary, budget_ms: f64) -> Verdict {
    const RULE: &str = "legacy queues in the seed's run";
    let median = |figure| summary.get("legacy", figure).map(|s| s.median);
    let (Some(pending), Some(p99)) = (median("pending_peak"), median("p99_ms")) else {
        return verdict(
            RULE,
            false,
            "pending_peak or p99_ms missing from a legacy run".into(),
        );
    };
    verdict(
        RULE,
        pending > 0.0 && p99 > budget_ms,
        format!("legacy pending peak {pending:.0}, p99 {p99:.0} ms (budget {budget_ms:.0} ms)"),
    )
}

/// Propagate serves a whole second in budget within 1 s of the fault going away.
fn recovered(summary: &Summary) -> Verdict {
    const RULE: &str = "propagate recovers within 1 s";
    let mut v = at_most(
        summary,
        RULE,
        "propagate",
        ("recovery_ms", MAX_RECOVERY_MS),
        |worst| format!("slowest recovery {worst:.0} ms, limit {MAX_RECOVERY_MS:.0} ms"),
    );
    if v.detail.contains("missing") {
        v.detail = "a propagate run never served a whole second in budget again".to_owned();
    }
    v
}

/// In every run of `saturation` the metrics say: the catalog's executor, no pool queue.
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

/// In every run of `pool-queue` the metrics say: calls wait for a slot, the call is fast.
fn pool_queued(summary: &Summary, budget_ms: f64) -> Verdict {
    every_run_answers(
        summary,
        budget_ms,
        "the metrics say: pool queue",
        |answer, _| *answer == Answer::PoolQueue,
        "pending_mean",
    )
}

/// `rule` holds when both modes ran and `expected(answer, pending_mean)` holds in every
/// run; the detail names each run that broke it, or else propagate's median of `shown`.
fn every_run_answers(
    summary: &Summary,
    budget_ms: f64,
    rule: &str,
    expected: impl Fn(&Answer, f64) -> bool,
    shown: &str,
) -> Verdict {
    let mut wrong: Vec<String> = MODES
        .iter()
        .filter(|mode| summary.values(mode, "k6_exit").is_empty())
        .map(|mode| format!("no {mode} run"))
        .collect();
    for run in &summary.runs {
        let answer = diagnosis::answer(&run.figures, budget_ms);
        let pending = run.figures.get("pending_mean").copied().unwrap_or(f64::NAN);
        if !expected(&answer, pending) {
            let (mode, repeat) = (&run.mode, run.repeat);
            wrong.push(format!(
                "{mode} #{repeat}: {answer}, pool pending mean {pending:.1}"
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

/// A rule comparing the medians of a figure over the two sides' runs: its name, the
/// figure, when it holds (first side's median, second's), and the detail it shows.
type Comparison = (
    &'static str,
    &'static str,
    fn(f64, f64) -> bool,
    fn(f64, f64) -> String,
);

/// `stragglers`: hedging off against on.
#[rustfmt::skip]
const STRAGGLERS: [Comparison; 3] = [
    ("hedging cuts the p99.9 by 90 %", "p999_ms", |off, on| on <= MAX_P999_RATIO * off,
     |off, on| format!("p99.9 {off:.0} ms off, {on:.0} ms on ({:.2})", on / off)),
    ("hedging adds at most 2 % catalog attempts", "attempts_per_order", |off, on| on <= MAX_CALLS_RATIO * off,
     |off, on| format!("{off:.4} off, {on:.4} on calls per order ({:.3})", on / off)),
    ("hedging lowers no goodput", "goodput_per_s", |off, on| on >= MIN_GOODPUT_WITH_HEDGING * off,
     |off, on| format!("{off:.1} off, {on:.1} on orders/s")),
];

/// `tight`: the deadline rule of extra attempts off against on.
#[rustfmt::skip]
const TIGHT: [Comparison; 2] = [
    ("the deadline rule leaves 90 % fewer extra attempts cut", "extra_attempts_cut_per_s",
     |blind, aware| aware <= MAX_CUT_RATIO * blind,
     |blind, aware| format!("{blind:.2}/s blind, {aware:.2}/s aware")),
    ("the deadline rule costs at most 0.5 points of orders in time", "in_time_share",
     |blind, aware| aware >= blind - MAX_IN_TIME_LOSS,
     |blind, aware| format!("{:.2} % blind, {:.2} % aware", blind * 100.0, aware * 100.0)),
];

/// [`Comparison`] over the two `sides`; it fails when a run of either lacks the figure.
fn compare(
    summary: &Summary,
    sides: [&str; 2],
    (rule, figure, holds, show): &Comparison,
) -> Verdict {
    let median = |side| {
        let rows = runs(summary, rule, side, &[figure])?;
        let values: Vec<f64> = rows.iter().map(|r| r[0]).collect();
        Ok(spread(&values).map_or(f64::NAN, |s| s.median))
    };
    match (median(sides[0]), median(sides[1])) {
        (Ok(a), Ok(b)) => verdict(rule, holds(a, b), show(a, b)),
        (Err(v), _) | (_, Err(v)) => v,
    }
}

/// The rules of the hedging scenarios, each over its own two sides (hedging, or the
/// deadline rule, off against on); `None` for any other scenario or pair of sides.
fn hedging_rules(summary: &Summary) -> Option<Vec<Verdict>> {
    let sides: Vec<&str> = summary.sides.iter().map(String::as_str).collect();
    let sides: [&str; 2] = sides.try_into().ok()?;
    let compared =
        |rules: &[Comparison]| rules.iter().map(|r| compare(summary, sides, r)).collect();
    match (summary.scenario.as_str(), sides) {
        ("stragglers", ["hedging-off", "hedging-on"]) => Some(compared(&STRAGGLERS)),
        ("tight", ["deadline-blind", "deadline-aware"]) => Some(compared(&TIGHT)),
        ("outage", ["hedging-off", "hedging-on"]) => Some(
            sides
                .iter()
                .map(|side| {
                    let rule =
                        format!("{side}: at most 1.05 catalog calls per order in the outage");
                    let limit = ("outage_calls_per_order", MAX_OUTAGE_CALLS_PER_ORDER);
                    at_most(summary, &rule, side, limit, |worst| {
                        format!("at most {worst:.3}")
                    })
                })
                .collect(),
        ),
        _ => None,
    }
}

/// `partition`: propagate's locks held no longer than budget + 1 s whatever the network
/// does; no transaction of either mode survives the heal; propagate's goodput back.
fn partition_bounded(summary: &Summary, budget_ms: f64) -> Vec<Verdict> {
    let limit = budget_ms + MAX_LOCK_HOLD_PAST_BUDGET_MS;
    let mut verdicts = vec![at_most(
        summary,
        "propagate holds row locks no longer than budget + 1 s during the cut",
        "propagate",
        ("longest_write_xact_ms", limit),
        |worst| format!("longest {worst:.0} ms, limit {limit:.0} ms"),
    )];
    for side in MODES {
        verdicts.push(at_most(
            summary,
            &format!("{side}: no transaction left without a client after the heal"),
            side,
            ("clientless_xacts_after_heal", 0.0),
            |worst| format!("at most {worst:.0} left"),
        ));
    }
    let rule = "propagate's goodput comes back after the heal";
    let figures = ["goodput_before_cut_per_s", "goodput_after_heal_per_s"];
    let back = runs(summary, rule, "propagate", &figures).map(|rows| {
        let worst = rows
            .iter()
            .map(|r| if r[0] > 0.0 { r[1] / r[0] } else { 0.0 })
            .fold(f64::MAX, f64::min);
        let detail = format!("after / before at least {worst:.2}, limit {MIN_GOODPUT_AFTER_HEAL}");
        verdict(rule, worst >= MIN_GOODPUT_AFTER_HEAL, detail)
    });
    verdicts.push(back.unwrap_or_else(|v| v));
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A summary of `scenario` with one run per entry (`sides[0]`'s, then `sides[1]`'s
    /// alternating), each with `GOOD`'s figures and then its own (which win).
    fn summary_of(scenario: &str, sides: [&str; 2], runs: &[(usize, &[(&str, f64)])]) -> Summary {
        let runs = runs.iter().enumerate().map(|(i, (side, own))| {
            let figures = GOOD.iter().chain(own.iter());
            crate::summary::RunFigures {
                mode: sides[*side].into(),
                repeat: i / 2,
                figures: figures.map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            }
        });
        Summary::new(
            scenario,
            String::new(),
            "",
            serde_json::Value::Null,
            sides,
            runs,
        )
    }

    /// Legacy with `GOOD` alone, propagate with `own` too.
    fn modes(scenario: &str, legacy: &[(&str, f64)], propagate: &[(&str, f64)]) -> Summary {
        summary_of(scenario, MODES, &[(0, legacy), (1, propagate)])
    }

    fn find(verdicts: &[Verdict], rule: &str) -> Verdict {
        let found = verdicts.iter().find(|v| v.rule.starts_with(rule)).cloned();
        found.unwrap_or_else(|| panic!("no rule {rule}: {verdicts:?}"))
    }

    fn holds(s: &Summary, rule: &str) -> bool {
        find(&check(s, 700.0, 100.0), rule).ok
    }

    fn all_ok(verdicts: &[Verdict]) -> bool {
        verdicts.iter().all(|v| v.ok)
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

    #[test]
    fn good_figures_pass_and_a_missing_or_bad_one_fails_its_rule() {
        let verdicts = check(&modes("happy", &[], &[]), 700.0, 100.0);
        assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
        assert_eq!(verdicts.len(), 5);
        for (figure, rule) in [
            ("k6_exit", "k6"),
            ("p99_ms", "propagate p99"),
            ("rss_start_mib", "propagate memory"),
            ("rss_peak_mib", "propagate memory"),
            ("pending_peak", "propagate pending"),
            ("pending_limit", "propagate pending"),
            ("in_flight_end", "propagate in-flight"),
        ] {
            let nan = modes("happy", &[], &[(figure, f64::NAN)]);
            assert!(!holds(&nan, rule), "{rule} passed with {figure} NaN");
            let mut gone = nan.clone();
            gone.runs[1].figures.remove(figure);
            assert!(!holds(&gone, rule), "{rule} passed without {figure}");
        }
        for (figure, value, rule) in [
            ("k6_exit", 99.0, "k6"),
            ("p99_ms", 978.0, "propagate p99"),
            ("rss_peak_mib", 60.0, "propagate memory"),
            ("pending_peak", 51.0, "propagate pending"),
            ("in_flight_end", 3.0, "propagate in-flight"),
        ] {
            let bad = modes("happy", &[], &[(figure, value)]);
            assert!(!holds(&bad, rule), "{rule} passed with {figure} = {value}");
        }
    }

    #[test]
    fn a_side_without_runs_fails_the_check() {
        let no_legacy = summary_of("happy", MODES, &[(1, &[])]);
        assert!(!holds(&no_legacy, "k6"));
        let no_propagate = summary_of("happy", MODES, &[(0, &[])]);
        for rule in [
            "k6",
            "propagate p99",
            "propagate memory",
            "propagate pending",
        ] {
            assert!(
                !holds(&no_propagate, rule),
                "{rule} passed with no propagate run"
            );
        }
    }

    #[test]
    fn goodput_needs_one_and_a_half_times_a_legacy_figure_that_exists() {
        let propagate = [("goodput_per_s", 81.0)];
        let goodput = |legacy| modes("goodput", &[("goodput_per_s", legacy)], &propagate);
        assert!(holds(&goodput(40.0), "goodput"));
        assert!(!holds(&goodput(60.0), "goodput"));
        assert!(!holds(&goodput(f64::NAN), "goodput"));
        assert!(holds(&goodput(0.0), "goodput"), "a legacy zero counts");
        assert!(!holds(&modes("goodput", &[], &propagate), "goodput"));
    }

    #[test]
    fn the_seed_run_must_show_legacy_queueing_and_recovery_take_at_most_a_second() {
        let seed = |pending| {
            modes(
                "seed",
                &[("pending_peak", pending), ("p99_ms", 4000.0)],
                &[],
            )
        };
        assert!(holds(&seed(200.0), "legacy queues"));
        assert!(!holds(&seed(0.0), "legacy queues"));
        let mut missing = seed(200.0);
        missing.modes.get_mut("legacy").unwrap().remove("p99_ms");
        let v = find(&check(&missing, 700.0, 50.0), "legacy queues");
        assert!(!v.ok && v.detail.contains("missing"), "{}", v.detail);

        let recovery = |ms: f64| modes("recovery", &[], &[("recovery_ms", ms)]);
        assert!(holds(&recovery(300.0), "propagate recovers"));
        assert!(!holds(&recovery(1200.0), "propagate recovers"));
        assert!(!holds(&modes("recovery", &[], &[]), "propagate recovers"));
    }

    const SATURATED: &[(&str, f64)] = &[
        ("orders_busy_ratio", 0.1),
        ("catalog_busy_ratio", 0.98),
        ("catalog_call_mean_ms", 300.0),
        ("pending_mean", 0.0),
    ];
    const QUEUED: &[(&str, f64)] = &[
        ("orders_busy_ratio", 0.1),
        ("catalog_busy_ratio", 0.05),
        ("catalog_call_mean_ms", 21.0),
        ("pending_mean", 27.0),
    ];

    #[test]
    fn the_saturation_and_pool_queue_runs_must_read_as_their_answer_in_every_run() {
        for (scenario, rule, good, breaks) in [
            (
                "saturation",
                "the metrics say: saturated executor",
                SATURATED,
                &[("catalog_busy_ratio", 0.5), ("pending_mean", 12.0)][..],
            ),
            (
                "pool-queue",
                "the metrics say: pool queue",
                QUEUED,
                &[
                    ("catalog_call_mean_ms", 300.0),
                    ("orders_busy_ratio", 0.95),
                    ("pending_mean", 0.2),
                ],
            ),
        ] {
            let v = find(&check(&modes(scenario, good, good), 700.0, 50.0), rule);
            assert!(v.ok, "{scenario}: {}", v.detail);
            for &(figure, value) in breaks {
                let own: Vec<(&str, f64)> = good.iter().copied().chain([(figure, value)]).collect();
                let v = find(&check(&modes(scenario, good, &own), 700.0, 50.0), rule);
                assert!(
                    !v.ok && v.detail.contains("propagate #"),
                    "{figure} = {value}: {}",
                    v.detail
                );
            }
            // No runtime figure, or no legacy run: no pass.
            assert!(!holds(&modes(scenario, good, &[]), rule), "{scenario}");
            let one_mode = summary_of(scenario, MODES, &[(1, good)]);
            let v = find(&check(&one_mode, 700.0, 50.0), rule);
            assert!(!v.ok && v.detail.contains("no legacy run"), "{}", v.detail);
        }
    }

    #[test]
    fn other_sides_than_the_modes_each_get_the_propagate_rules_and_no_scenario_rule() {
        let sides = ["metrics-off", "metrics-on"];
        let verdicts = check(
            &summary_of("goodput", sides, &[(0, &[]), (1, &[])]),
            700.0,
            100.0,
        );
        assert!(all_ok(&verdicts), "{verdicts:?}");
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
        let good: &[(&str, f64)] = &[
            ("longest_write_xact_ms", 1500.0),
            ("clientless_xacts_after_heal", 0.0),
            ("goodput_before_cut_per_s", 80.0),
            ("goodput_after_heal_per_s", 78.0),
        ];
        let with = |figure: &'static str, value: f64| -> Vec<(&str, f64)> {
            good.iter().copied().chain([(figure, value)]).collect()
        };
        let verdicts = check(&modes("partition", good, good), 700.0, 50.0);
        assert!(all_ok(&verdicts), "{verdicts:?}");
        let held = modes("partition", good, &with("longest_write_xact_ms", 20_000.0));
        assert!(!holds(&held, "propagate holds row locks"));
        let ghost = modes("partition", &with("clientless_xacts_after_heal", 1.0), good);
        assert!(!holds(&ghost, "legacy: no transaction left"));
        let slow = modes("partition", good, &with("goodput_after_heal_per_s", 40.0));
        assert!(!holds(&slow, "propagate's goodput comes back"));
        let verdicts = check(&modes("partition", &[], &[]), 700.0, 50.0);
        let failed = verdicts.iter().filter(|v| !v.ok).count();
        assert_eq!(failed, 4, "missing figures: {verdicts:?}");
    }

    #[test]
    fn three_hops_need_every_hop_by_its_deadline_and_one_layer_retrying() {
        let hops = |pricing_late: f64, calls: f64| {
            [
                ("orders_late_share", 0.001),
                ("catalog_late_share", 0.0),
                ("pricing_late_share", pricing_late),
                ("pricing_calls_per_order", calls),
                ("goodput_per_s", 70.0),
            ]
        };
        let legacy = [("goodput_per_s", 8.0), ("pricing_calls_per_order", 2.0)];
        let down = modes("pricing-down", &legacy, &hops(0.0, 1.04));
        assert!(all_ok(&check(&down, 700.0, 100.0)));
        let late = modes("pricing-down", &legacy, &hops(0.02, 1.04));
        assert!(!holds(&late, "propagate: pricing answers by its deadline"));
        let compounding = modes("pricing-down", &legacy, &hops(0.0, 2.08));
        assert!(!holds(&compounding, "propagate: at most 1.1 pricing calls"));
        // A hop that exported nothing proves nothing.
        let mut blind = modes("pricing-slow", &legacy, &hops(0.0, 1.0));
        blind.runs[1].figures.remove("catalog_late_share");
        assert!(!holds(&blind, "propagate: catalog answers by its deadline"));
        assert!(holds(&blind, "goodput propagate / legacy"));
        // Per-hop retries: the rule is the one-hop side's; the other only reports.
        let retry = ["every-hop", "one-hop"];
        let (every, one) = (hops(0.0, 2.08), hops(0.0, 1.04));
        let both = summary_of("pricing-down", retry, &[(0, &every), (1, &one)]);
        assert!(all_ok(&check(&both, 700.0, 100.0)));
    }

    #[test]
    fn the_hedging_scenarios_hold_their_targets_and_fail_past_them() {
        let versus = |scenario, sides, a: &[(&str, f64)], b: &[(&str, f64)]| {
            check(&summary_of(scenario, sides, &[(0, a), (1, b)]), 700.0, 50.0)
        };
        let ok = |verdicts: Vec<Verdict>, rule| find(&verdicts, rule).ok;
        let hedging = ["hedging-off", "hedging-on"];
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
        assert!(all_ok(&versus("stragglers", hedging, &off, &on)));
        let costly = [
            ("p999_ms", 60.0),
            ("attempts_per_order", 1.05),
            ("goodput_per_s", 191.0),
        ];
        let costly = versus("stragglers", hedging, &off, &costly);
        assert!(!ok(costly, "hedging adds at most 2 %"));

        let deadline = ["deadline-blind", "deadline-aware"];
        let blind = [("extra_attempts_cut_per_s", 5.0), ("in_time_share", 0.95)];
        let aware = [("extra_attempts_cut_per_s", 0.3), ("in_time_share", 0.948)];
        assert!(all_ok(&versus("tight", deadline, &blind, &aware)));
        let worse = [("extra_attempts_cut_per_s", 0.3), ("in_time_share", 0.94)];
        assert!(!ok(
            versus("tight", deadline, &blind, &worse),
            "the deadline rule costs"
        ));

        let (off, on) = (
            [("outage_calls_per_order", 1.04)],
            [("outage_calls_per_order", 1.06)],
        );
        let outage = versus("outage", hedging, &off, &on);
        assert!(find(&outage, "hedging-off: at most 1.05").ok);
        assert!(!find(&outage, "hedging-on: at most 1.05").ok);
        assert!(!ok(
            versus("outage", hedging, &[], &[]),
            "hedging-off: at most 1.05"
        ));
    }
}
