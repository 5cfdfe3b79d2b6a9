//! `cargo xtask readme-tables`: the README's result tables, generated from the
//! summaries committed under `docs/results/`, so every figure in the README names the
//! commit that produced it and can be traced to its files.

use std::fmt::Write as _;
use std::path::Path;

use crate::scenario::Scenario;
use crate::summary::{self, Summary};

/// The markdown for every scenario that has a committed summary under `dir`.
pub fn tables(dir: &Path) -> anyhow::Result<String> {
    use clap::ValueEnum as _;
    let mut out = String::new();
    for scenario in Scenario::value_variants() {
        let path = dir.join(scenario.name()).join("summary.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let summary: Summary = serde_json::from_str(&text)?;
        writeln!(out, "#### `{}`\n", scenario.name())?;
        writeln!(out, "{}\n", headline(&summary))?;
        writeln!(
            out,
            "Commit `{}`, {} build, {} run(s) per mode, median (min–max); \
             [summary](docs/results/{name}/summary.md), [chart](docs/results/{name}/chart.svg), \
             command `cargo xtask experiment {name} --repeat {} --duration {}s --out docs/results/{name}`.\n",
            summary.commit,
            summary.profile,
            summary.repeats,
            summary.repeats,
            summary.load["duration"].as_f64().unwrap_or(0.0),
            name = scenario.name(),
        )?;
        out.push_str(&summary::markdown_table(&summary));
        out.push('\n');
    }
    Ok(out)
}

/// The one sentence a reader wants from a scenario.
fn headline(summary: &Summary) -> String {
    let median = |mode, figure| summary.get(mode, figure).map_or(f64::NAN, |s| s.median);
    match summary.scenario.as_str() {
        "goodput" => format!(
            "Goodput: legacy {:.1} orders/s, propagate {:.1} orders/s ({:.2}×).",
            median("legacy", "goodput_per_s"),
            median("propagate", "goodput_per_s"),
            summary.ratio("goodput_per_s").unwrap_or(f64::NAN)
        ),
        "recovery" => format!(
            "Recovery after the latency is removed: legacy {:.0} ms, propagate {:.0} ms.",
            median("legacy", "recovery_ms"),
            median("propagate", "recovery_ms")
        ),
        "happy" => format!(
            "Throughput without a fault, propagate / legacy: {:.2} ({:.0} / {:.0} orders/s).",
            summary.ratio("created_per_s").unwrap_or(f64::NAN),
            median("propagate", "created_per_s"),
            median("legacy", "created_per_s")
        ),
        _ => format!(
            "p99: legacy {:.0} ms, propagate {:.0} ms.",
            median("legacy", "p99_ms"),
            median("propagate", "p99_ms")
        ),
    }
}
