//! The summary of one invocation: every run's figures, their median and min–max per
//! mode, and the markdown the published result tables are generated from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::diagnosis::{self, Answer};
use crate::run::ModeRun;
use crate::stats::{Spread, spread};

/// The modes, in table order: the sides unless they are another [`crate::scenario::Versus`].
pub const MODES: [&str; 2] = ["legacy", "propagate"];

fn default_sides() -> Vec<String> {
    MODES.map(str::to_owned).to_vec()
}

/// What `summary.json` holds: the scenario, the commit that produced it, the build
/// profile, and the load both sides got (as the scenario defined it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub scenario: String,
    pub commit: String,
    pub profile: String,
    pub load: serde_json::Value,
    /// The two sides compared, in table order (summaries written before there was a
    /// choice compared the modes).
    #[serde(default = "default_sides")]
    pub sides: Vec<String>,
    /// Per side, what its runs' metrics answer to "pool queue, slow downstream or
    /// saturated executor?" ([`crate::diagnosis`]); empty in older summaries.
    #[serde(default)]
    pub answers: BTreeMap<String, String>,
    /// Runs per side; per side, per figure, the spread over the repeats; every run's
    /// figures, in the order they ran.
    pub repeats: usize,
    pub modes: BTreeMap<String, BTreeMap<String, Spread>>,
    pub runs: Vec<RunFigures>,
}

/// One run's figures by name, without its time series.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunFigures {
    pub mode: String,
    pub repeat: usize,
    pub figures: BTreeMap<String, f64>,
}

impl From<&ModeRun> for RunFigures {
    fn from(r: &ModeRun) -> Self {
        let (mode, figures) = (r.mode.clone(), r.figures.clone());
        Self {
            mode,
            repeat: r.repeat,
            figures,
        }
    }
}

impl Summary {
    /// Aggregates `runs` of the two `sides`.
    pub fn new(
        scenario: &str,
        commit: String,
        profile: &str,
        load: serde_json::Value,
        sides: [&str; 2],
        runs: impl IntoIterator<Item = RunFigures>,
    ) -> Self {
        let runs: Vec<RunFigures> = runs.into_iter().collect();
        let budget_ms = load["budget_ms"].as_f64().unwrap_or(f64::NAN);
        let mut modes = BTreeMap::new();
        let mut answers = BTreeMap::new();
        for mode in sides {
            let mine: Vec<&RunFigures> = runs.iter().filter(|r| r.mode == mode).collect();
            let names: Vec<&String> = mine
                .first()
                .map(|r| r.figures.keys().collect())
                .unwrap_or_default();
            let figures = names
                .into_iter()
                .filter_map(|name| {
                    let values: Vec<f64> = mine
                        .iter()
                        .filter_map(|r| r.figures.get(name).copied())
                        .collect();
                    spread(&values).map(|s| (name.clone(), s))
                })
                .collect();
            modes.insert(mode.to_owned(), figures);
            let answered: Vec<Answer> = mine
                .iter()
                .map(|r| diagnosis::answer(&r.figures, budget_ms))
                .collect();
            answers.insert(mode.to_owned(), diagnosis::of_runs(&answered));
        }
        let repeats = runs.iter().filter(|r| r.mode == sides[0]).count();
        Self {
            scenario: scenario.to_owned(),
            commit,
            profile: profile.to_owned(),
            load,
            sides: sides.map(str::to_owned).to_vec(),
            answers,
            repeats,
            modes,
            runs,
        }
    }

    /// The spread of `figure` in `mode`.
    pub fn get(&self, mode: &str, figure: &str) -> Option<Spread> {
        self.modes.get(mode)?.get(figure).copied()
    }

    /// Every run's value of `figure` in `mode` (`NaN` where a run had none).
    pub fn values(&self, mode: &str, figure: &str) -> Vec<f64> {
        self.runs
            .iter()
            .filter(|r| r.mode == mode)
            .map(|r| r.figures.get(figure).copied().unwrap_or(f64::NAN))
            .collect()
    }

    /// Per repeat, the second side's `figure` over the first's: adjacent runs, under the
    /// same conditions. Repeats lacking either value, or whose first is 0, left out.
    pub fn pair_ratios(&self, figure: &str) -> Vec<f64> {
        let Some([first, second]) = self.side_names() else {
            return Vec::new();
        };
        let value = |side: &str, repeat: usize| {
            self.runs
                .iter()
                .find(|r| r.mode == side && r.repeat == repeat)
                .and_then(|r| r.figures.get(figure).copied())
        };
        (0..self.repeats)
            .filter_map(|repeat| {
                let (a, b) = (value(first, repeat)?, value(second, repeat)?);
                (a > 0.0).then(|| b / a)
            })
            .collect()
    }

    fn side_names(&self) -> Option<[&str; 2]> {
        match self.sides.as_slice() {
            [a, b] => Some([a.as_str(), b.as_str()]),
            _ => None,
        }
    }
}

/// The rows of the markdown table: figure, decimals, label.
#[rustfmt::skip]
const ROWS: &[(&str, usize, &str)] = &[
    ("goodput_per_s",                1, "goodput: orders created within the budget, per s"),
    ("sent_per_s",                   1, "orders sent, per s"),
    ("created_per_s",                1, "201 created (any latency), per s"),
    ("refused_per_s",                1, "503 refused early, per s"),
    ("predicted_late_per_s",         1, "of the 503s, refused by admission (predicted late), per s"),
    ("expired_per_s",                1, "504 deadline ran out, per s"),
    ("gave_up_per_s",                1, "client gave up at its timeout, per s"),
    ("late_per_s",                   1, "answered later than budget + margin, or never, per s"),
    ("other",                        0, "other outcomes (total)"),
    ("p50_ms",                       0, "p50 latency, ms"),
    ("p99_ms",                       0, "p99 latency, ms"),
    ("p999_ms",                      0, "p99.9 latency, ms"),
    ("in_time_share",                4, "orders created within their budget, share of orders sent"),
    ("max_ms",                       0, "max latency, ms"),
    ("catalog_calls_per_s",          1, "calls the catalog received, per s"),
    ("attempts_per_order",           3, "catalog attempts sent per order (hedges, retries, dropped ones too)"),
    ("hedges_per_s",                 2, "hedges sent, per s"),
    ("attempts_cut_per_s",           2, "catalog attempts cut at the deadline or answered 504, per s"),
    ("extra_attempts_cut_per_s",     2, "of the hedges and retries, cut at the deadline or answered 504, per s"),
    ("extra_refused_deadline_per_s", 2, "extra attempts not sent: less left than nine attempts in ten take, per s"),
    ("outage_calls_per_order",       3, "outage: calls the catalog received per order while it refused everything"),
    ("catalog_calls_per_order",      3, "calls the catalog received per order"),
    ("pricing_calls_per_order",      3, "three hops: calls pricing-service received per order"),
    ("orders_late_share",            4, "three hops: orders-service answers past its deadline + 10 ms, share"),
    ("catalog_late_share",           4, "three hops: catalog-service answers past its deadline + 10 ms, share"),
    ("pricing_late_share",           4, "three hops: pricing-service answers past its deadline + 10 ms, share"),
    ("catalog_busy_slots",           1, "catalog slots busy (mean requests in flight)"),
    ("catalog_wasted_slots",         1, "of them, busy for callers that had gone (no answer)"),
    ("pending_peak",                 0, "catalog pool pending, peak"),
    ("pending_limit",                0, "catalog pool pending, limit"),
    ("pending_mean",                 1, "catalog pool pending, mean"),
    ("catalog_call_mean_ms",         0, "catalog call as orders-service times it (pool wait excluded), mean ms"),
    ("orders_busy_ratio",            2, "orders-service workers busy, share of their time"),
    ("catalog_busy_ratio",           2, "catalog-service workers busy, share of their time"),
    ("orders_global_queue_peak",     0, "orders-service tasks waiting for a worker, peak"),
    ("catalog_global_queue_peak",    0, "catalog-service tasks waiting for a worker, peak"),
    ("orders_alive_tasks_peak",      0, "orders-service tasks alive, peak"),
    ("active_peak",                  0, "catalog pool active, peak"),
    ("in_flight_peak",               0, "in-flight orders, peak"),
    ("rss_start_mib",                1, "RSS at the start, MiB"),
    ("rss_peak_mib",                 1, "RSS peak, MiB"),
    ("rss_end_mib",                  1, "RSS after the drain, MiB"),
    ("drain_ms",                     0, "in-flight back to 0 after the load, ms"),
    ("in_flight_end",                0, "in-flight orders when the drain ended"),
    ("recovery_ms",                  0, "recovery: first whole second served in budget at 95%, ms after the fault went"),
    ("longest_write_xact_ms",        0, "partition: longest write transaction on the server (row locks held), ms"),
    ("clientless_xacts_peak",        0, "partition: write transactions left without a client, peak"),
    ("clientless_xacts_after_heal",  0, "partition: of them, still there a second after the heal"),
    ("goodput_before_cut_per_s",     1, "partition: goodput before the cut, per s"),
    ("goodput_after_heal_per_s",     1, "partition: goodput after the heal, per s"),
    ("k6_exit",                      0, "k6 exit code"),
];

/// `median (min–max)`, or the value alone when every run agreed.
pub fn cell(spread: Option<Spread>, decimals: usize) -> String {
    match spread {
        None => "-".to_owned(),
        Some(s) if s.min == s.max => format!("{:.*}", decimals, s.median),
        Some(s) => format!(
            "{:.*} ({:.*}–{:.*})",
            decimals, s.median, decimals, s.min, decimals, s.max
        ),
    }
}

/// The summary as a markdown table, legacy against propagate.
pub fn markdown_table(summary: &Summary) -> String {
    table(summary, |_| true)
}

/// The figures of the first table (the printed report, the top of `summary.md`, a
/// results block naming no rows): what the acceptance rules read.
pub const KEY_FIGURES: [&str; 11] = [
    "goodput_per_s",
    "sent_per_s",
    "refused_per_s",
    "expired_per_s",
    "gave_up_per_s",
    "p50_ms",
    "p99_ms",
    "pending_peak",
    "pending_limit",
    "in_flight_peak",
    "rss_peak_mib",
];

/// The first table: [`KEY_FIGURES`] only.
pub fn key_table(summary: &Summary) -> String {
    markdown_table_of(summary, &KEY_FIGURES)
}

/// The rows of `figures` only (in the whole table's order), legacy against propagate.
pub fn markdown_table_of(summary: &Summary, figures: &[&str]) -> String {
    table(summary, |figure| figures.contains(&figure))
}

fn table(summary: &Summary, keep: impl Fn(&str) -> bool) -> String {
    let sides = &summary.sides;
    let mut out = format!(
        "| | {} |\n| --- |{}\n",
        sides.join(" | "),
        " ---: |".repeat(sides.len())
    );
    for (figure, decimals, label) in ROWS.iter().filter(|(figure, ..)| keep(figure)) {
        let cells: Vec<String> = sides
            .iter()
            .map(|m| cell(summary.get(m, figure), *decimals))
            .collect();
        if cells.iter().all(|c| c == "-") {
            continue;
        }
        out.push_str(&format!("| {label} | {} |\n", cells.join(" | ")));
    }
    out
}

/// Each side's answer to "pool queue, slow downstream or saturated executor?", if any.
pub fn answers_markdown(summary: &Summary) -> String {
    let lines: Vec<String> = summary
        .sides
        .iter()
        .filter_map(|side| Some(format!("- {side}: **{}**", summary.answers.get(side)?)))
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "Pool queue, slow downstream or saturated executor? From the services' metrics alone \
         ([how](../../operating.md#pool-queue-slow-downstream-or-saturated-executor)):\n\n{}\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_table_is_short_and_its_figures_are_rows() {
        assert!(KEY_FIGURES.len() <= 12);
        for figure in KEY_FIGURES {
            assert!(
                ROWS.iter().any(|(f, ..)| *f == figure),
                "{figure} has no row"
            );
        }
        let published = crate::stack::workspace().join("docs/results/goodput/summary.json");
        let summary: Summary =
            serde_json::from_str(&std::fs::read_to_string(published).unwrap()).unwrap();
        let table = key_table(&summary);
        assert_eq!(table.lines().count(), 2 + KEY_FIGURES.len(), "{table}");
        assert!(markdown_table(&summary).lines().count() > table.lines().count());
    }

    #[test]
    fn cells_show_median_and_range() {
        assert_eq!(cell(spread(&[40.0, 41.0, 44.0]), 1), "41.0 (40.0–44.0)");
        assert_eq!(cell(spread(&[0.0, 0.0]), 0), "0");
        assert_eq!(cell(None, 0), "-");
    }

    fn mode_run(side: &str, repeat: usize, created: f64, busy: Option<f64>) -> ModeRun {
        ModeRun {
            mode: side.into(),
            repeat,
            figures: [
                ("created_per_s", Some(created)),
                ("catalog_call_mean_ms", Some(400.0)),
            ]
            .into_iter()
            .chain(["orders_busy_ratio", "catalog_busy_ratio"].map(|f| (f, busy)))
            .filter_map(|(f, v)| Some((f.to_owned(), v?)))
            .collect(),
            ..ModeRun::default()
        }
    }

    #[test]
    fn other_sides_head_the_table_and_pair_ratios_compare_adjacent_runs() {
        let runs = [
            mode_run("metrics-off", 0, 100.0, None),
            mode_run("metrics-on", 0, 98.0, Some(0.95)),
            mode_run("metrics-on", 1, 126.0, Some(0.2)),
            mode_run("metrics-off", 1, 120.0, None),
        ];
        let load = serde_json::json!({"budget_ms": 700});
        let summary = Summary::new(
            "happy",
            "abc".into(),
            "release",
            load,
            ["metrics-off", "metrics-on"],
            runs.iter().map(RunFigures::from),
        );
        assert_eq!(summary.repeats, 2);
        assert_eq!(summary.pair_ratios("created_per_s"), vec![0.98, 1.05]);
        assert!(markdown_table_of(&summary, &["created_per_s"]).contains("| 201 created "));
        assert!(!markdown_table_of(&summary, &["p99_ms"]).contains("| 201 created "));
        let table = markdown_table(&summary);
        assert!(table.starts_with("| | metrics-off | metrics-on |\n| --- | ---: | ---: |\n"));
        assert!(table.contains(
            "| 201 created (any latency), per s | 110.0 (100.0–120.0) | 112.0 (98.0–126.0) |"
        ));
        // Without runtime metrics, no answer; with them, each run's, and they disagree.
        assert_eq!(
            summary.answers["metrics-off"],
            "unknown (no orders_busy_ratio)"
        );
        assert_eq!(
            summary.answers["metrics-on"],
            "runs disagree: saturated executor (orders-service, catalog-service) in 1 run, \
             slow downstream in 1 run"
        );
        let answers = answers_markdown(&summary);
        assert!(
            answers.contains("- metrics-on: **runs disagree"),
            "{answers}"
        );
    }
}
