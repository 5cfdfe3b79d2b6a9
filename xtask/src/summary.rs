//! The summary of one invocation: every run's figures, their median and min–max per
//! mode, and the markdown the published result tables are generated from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::run::ModeRun;
use crate::stats::{Spread, spread};

/// The modes, in the order the tables show them.
pub const MODES: [&str; 2] = ["legacy", "propagate"];

/// What `summary.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// The scenario's name.
    pub scenario: String,
    /// The commit that produced it (`git describe --always --dirty`).
    pub commit: String,
    /// `dev` or `release`.
    pub profile: String,
    /// The load both modes got (as the scenario defined it).
    pub load: serde_json::Value,
    /// Runs per mode.
    pub repeats: usize,
    /// Per mode, per figure: median, min, max over the repeats.
    pub modes: BTreeMap<String, BTreeMap<String, Spread>>,
    /// Every run's figures, in the order they ran.
    pub runs: Vec<RunFigures>,
}

/// One run's figures, without its time series.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunFigures {
    /// `legacy` or `propagate`.
    pub mode: String,
    /// Which repeat.
    pub repeat: usize,
    /// The figures, by name.
    pub figures: BTreeMap<String, f64>,
}

impl Summary {
    /// Aggregates `runs`.
    pub fn new(
        scenario: &str,
        commit: String,
        profile: &str,
        load: serde_json::Value,
        runs: &[ModeRun],
    ) -> Self {
        let runs: Vec<RunFigures> = runs
            .iter()
            .map(|r| RunFigures {
                mode: r.mode.clone(),
                repeat: r.repeat,
                figures: flatten(&r.figures),
            })
            .collect();
        let mut modes = BTreeMap::new();
        for mode in MODES {
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
        }
        let repeats = runs.iter().filter(|r| r.mode == MODES[0]).count();
        Self {
            scenario: scenario.to_owned(),
            commit,
            profile: profile.to_owned(),
            load,
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

    /// propagate's median over legacy's median of `figure`.
    pub fn ratio(&self, figure: &str) -> Option<f64> {
        let legacy = self.get("legacy", figure)?.median;
        let propagate = self.get("propagate", figure)?.median;
        (legacy > 0.0).then(|| propagate / legacy)
    }
}

/// The figures as name → value; `None` figures are left out.
fn flatten(figures: &impl Serialize) -> BTreeMap<String, f64> {
    let value = serde_json::to_value(figures).unwrap_or_default();
    value
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_f64().map(|v| (k.clone(), v)))
        .collect()
}

/// The rows of the markdown table: figure, label, decimals.
const ROWS: &[(&str, &str, usize)] = &[
    (
        "goodput_per_s",
        "goodput: orders created within the budget, per s",
        1,
    ),
    ("sent_per_s", "orders sent, per s", 1),
    ("created_per_s", "201 created (any latency), per s", 1),
    ("refused_per_s", "503 refused early, per s", 1),
    (
        "predicted_late_per_s",
        "of the 503s, refused by admission (predicted late), per s",
        1,
    ),
    ("expired_per_s", "504 deadline ran out, per s", 1),
    ("gave_up_per_s", "client gave up at its timeout, per s", 1),
    (
        "late_per_s",
        "answered later than budget + margin, or never, per s",
        1,
    ),
    ("other", "other outcomes (total)", 0),
    ("p50_ms", "p50 latency, ms", 0),
    ("p99_ms", "p99 latency, ms", 0),
    ("max_ms", "max latency, ms", 0),
    (
        "catalog_calls_per_s",
        "calls the catalog received, per s",
        1,
    ),
    (
        "catalog_busy_slots",
        "catalog slots busy (mean requests in flight)",
        1,
    ),
    (
        "catalog_wasted_slots",
        "of them, busy for callers that had gone (no answer)",
        1,
    ),
    ("pending_peak", "catalog pool pending, peak", 0),
    ("pending_limit", "catalog pool pending, limit", 0),
    ("active_peak", "catalog pool active, peak", 0),
    ("in_flight_peak", "in-flight orders, peak", 0),
    ("rss_start_mib", "RSS at the start, MiB", 1),
    ("rss_peak_mib", "RSS peak, MiB", 1),
    ("rss_end_mib", "RSS after the drain, MiB", 1),
    ("drain_ms", "in-flight back to 0 after the load, ms", 0),
    ("in_flight_end", "in-flight orders when the drain ended", 0),
    (
        "recovery_ms",
        "recovery: first whole second served in budget at 95%, ms after the fault went",
        0,
    ),
    ("k6_exit", "k6 exit code", 0),
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

/// The rows of `figures` only (in the whole table's order), legacy against propagate.
pub fn markdown_table_of(summary: &Summary, figures: &[&str]) -> String {
    table(summary, |figure| figures.contains(&figure))
}

fn table(summary: &Summary, keep: impl Fn(&str) -> bool) -> String {
    let mut out = String::from("| | legacy | propagate |\n| --- | ---: | ---: |\n");
    for (figure, label, decimals) in ROWS.iter().filter(|(figure, ..)| keep(figure)) {
        let cells: Vec<String> = MODES
            .iter()
            .map(|m| cell(summary.get(m, figure), *decimals))
            .collect();
        if cells.iter().all(|c| c == "-") {
            continue;
        }
        out.push_str(&format!("| {label} | {} | {} |\n", cells[0], cells[1]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mode: &str, repeat: usize, goodput: f64) -> RunFigures {
        RunFigures {
            mode: mode.into(),
            repeat,
            figures: BTreeMap::from([("goodput_per_s".into(), goodput)]),
        }
    }

    #[test]
    fn cells_show_median_and_range() {
        assert_eq!(cell(spread(&[40.0, 41.0, 44.0]), 1), "41.0 (40.0–44.0)");
        assert_eq!(cell(spread(&[0.0, 0.0]), 0), "0");
        assert_eq!(cell(None, 0), "-");
    }

    #[test]
    fn ratio_is_of_the_medians() {
        let mut summary = Summary {
            scenario: "goodput".into(),
            commit: "abc".into(),
            profile: "release".into(),
            load: serde_json::Value::Null,
            repeats: 2,
            modes: BTreeMap::new(),
            runs: vec![
                run("legacy", 0, 40.0),
                run("propagate", 0, 80.0),
                run("legacy", 1, 42.0),
                run("propagate", 1, 84.0),
            ],
        };
        for mode in MODES {
            let values = summary.values(mode, "goodput_per_s");
            summary.modes.insert(
                mode.into(),
                BTreeMap::from([("goodput_per_s".into(), spread(&values).unwrap())]),
            );
        }
        assert_eq!(summary.ratio("goodput_per_s"), Some(2.0));
        assert!(markdown_table(&summary).contains("| 41.0 (40.0–42.0) | 82.0 (80.0–84.0) |"));
        assert!(markdown_table_of(&summary, &["goodput_per_s"]).contains("| goodput: "));
        assert!(!markdown_table_of(&summary, &["p99_ms"]).contains("| goodput: "));
    }
}
