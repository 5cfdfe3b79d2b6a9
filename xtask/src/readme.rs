//! `cargo xtask readme-tables`: the result tables of the README and of
//! docs/experiment.md, generated from the summaries committed under `docs/results/`, so
//! every figure names the commit that produced it and can be traced to its files.
//!
//! Each file holds its generated blocks between marker lines, `<!-- NAME:begin -->` and
//! `<!-- NAME:end -->` (see [`begin`] and [`end`]); the command rewrites what lies
//! between them and leaves the rest of the file alone. The README gets the `goodput`
//! scenario in brief, then the cost and the three answers in a few sentences;
//! docs/experiment.md every published run in full and the three answers as a table.

use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use anyhow::Context as _;

use crate::scenario::Scenario;
use crate::summary::{self, Summary};

/// The marker line before the block `name`.
pub fn begin(name: &str) -> String {
    format!("<!-- {name}:begin -->")
}

/// The marker line after the block `name`.
pub fn end(name: &str) -> String {
    format!("<!-- {name}:end -->")
}

/// What a block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// The `goodput` scenario: its headline and the rows in [`BRIEF_ROWS`].
    Brief,
    /// Every published run, each with its headline, provenance and whole table.
    Full,
    /// What the technique costs without a fault (`happy`), what the metrics answer in
    /// the seed, saturation and pool-queue runs, and what the runtime metrics cost.
    Findings,
    /// The figures behind each published run's answer, one row per side ([`ANSWER_ROWS`]).
    AnswersTable,
    /// What a cut network and the extra attempts do: the `partition` runs and the
    /// `stragglers`, `tight` and `outage` runs, each with its figures.
    Faults,
}

/// The blocks the command keeps up to date: the file (relative to the workspace), the
/// block's marker name, and what it holds.
pub const TARGETS: &[(&str, &str, Content)] = &[
    ("README.md", "tables", Content::Brief),
    ("README.md", "findings", Content::Findings),
    ("README.md", "faults", Content::Faults),
    ("docs/experiment.md", "tables", Content::Full),
    ("docs/experiment.md", "answers", Content::AnswersTable),
];

/// The figures of the brief table, in the full table's order.
pub const BRIEF_ROWS: &[&str] = &[
    "goodput_per_s",
    "created_per_s",
    "refused_per_s",
    "expired_per_s",
    "gave_up_per_s",
    "p99_ms",
    "pending_peak",
    "in_flight_peak",
    "rss_peak_mib",
];

/// What the command did to one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The file, relative to the workspace.
    pub file: PathBuf,
    /// The block's marker name.
    pub block: &'static str,
    /// Whether the block differed from the generated one (and, unless checking, was
    /// rewritten).
    pub changed: bool,
}

/// Regenerates every target's block under `workspace`; with `check`, only compares.
pub fn update(workspace: &Path, check: bool) -> anyhow::Result<Vec<Outcome>> {
    let results = workspace.join("docs/results");
    let mut outcomes = Vec::new();
    for &(file, name, content) in TARGETS {
        let path = workspace.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let prefix = relative(Path::new(file), Path::new("docs/results"));
        let block = match content {
            Content::Brief => brief(&results, &prefix)?,
            Content::Full => full(&results, &prefix)?,
            Content::Findings => findings(
                &results,
                &format!(
                    "{}/experiment.md",
                    relative(Path::new(file), Path::new("docs"))
                ),
            )?,
            Content::AnswersTable => answers_table(&results, &prefix)?,
            Content::Faults => faults(&results, &prefix)?,
        };
        let new = replace_block(&text, name, &block).with_context(|| format!("in {file}"))?;
        let changed = new != text;
        if changed && !check {
            std::fs::write(&path, &new)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        outcomes.push(Outcome {
            file: PathBuf::from(file),
            block: name,
            changed,
        });
    }
    Ok(outcomes)
}

/// `text` with what lies between its one `begin(name)` line and its one `end(name)`
/// line replaced by `block` (set off by blank lines, so Markdown reads it as its own
/// blocks).
pub fn replace_block(text: &str, name: &str, block: &str) -> anyhow::Result<String> {
    let marker_lines = |marker: &str| -> Vec<usize> {
        let mut offset = 0;
        let mut found = Vec::new();
        for line in text.split_inclusive('\n') {
            if line.trim() == marker {
                found.push(offset);
            }
            offset += line.len();
        }
        found
    };
    let (begin, end) = (begin(name), end(name));
    let (begins, ends) = (marker_lines(&begin), marker_lines(&end));
    anyhow::ensure!(
        begins.len() == 1 && ends.len() == 1,
        "expected one `{begin}` line and one `{end}` line, found {} and {}",
        begins.len(),
        ends.len()
    );
    let (first, last) = (begins[0], ends[0]);
    anyhow::ensure!(first < last, "`{end}` comes before `{begin}`");
    let after_begin = first
        + text[first..]
            .find('\n')
            .map_or(text.len() - first, |n| n + 1);
    let block = block.trim_matches('\n');
    let mut out = String::with_capacity(text.len() + block.len());
    out.push_str(&text[..after_begin]);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    if !block.is_empty() {
        out.push('\n');
        out.push_str(block);
        out.push_str("\n\n");
    }
    out.push_str(&text[last..]);
    Ok(out)
}

/// The README's block: the `goodput` run's headline, its main rows, where it came from.
pub fn brief(results: &Path, prefix: &str) -> anyhow::Result<String> {
    let summary = read(&results.join("goodput"))?
        .context("no docs/results/goodput/summary.json: publish a goodput run first")?;
    let mut out = String::new();
    writeln!(out, "{}\n", headline(&summary))?;
    out.push_str(&summary::markdown_table_of(&summary, BRIEF_ROWS));
    writeln!(
        out,
        "\n{}; [all figures]({prefix}/goodput/summary.md), command `{}`.",
        provenance(&summary),
        command(&summary, "goodput", false, None),
    )?;
    Ok(out)
}

/// docs/experiment.md's block: every scenario with a committed summary, each followed
/// by its `-admission-off`, `-runtime-metrics` and `-session-bounds` twins when there
/// are.
pub fn full(results: &Path, prefix: &str) -> anyhow::Result<String> {
    use clap::ValueEnum as _;
    let mut out = String::new();
    for scenario in Scenario::value_variants() {
        let name = scenario.name();
        for (dir, title) in [
            (name.to_owned(), format!("`{name}`")),
            (
                format!("{name}-admission-off"),
                format!("`{name}`, admission off"),
            ),
            (
                format!("{name}-runtime-metrics"),
                format!("`{name}`, runtime metrics off against on"),
            ),
            (
                format!("{name}-session-bounds"),
                format!("`{name}`, the database sessions' bounds off against on"),
            ),
            (
                format!("{name}-hedging"),
                format!("`{name}`, hedging off against on"),
            ),
            (
                format!("{name}-hedge-deadline"),
                format!("`{name}`, hedging deadline-blind against deadline-aware"),
            ),
        ] {
            let Some(summary) = read(&results.join(&dir))? else {
                continue;
            };
            let flamegraphs = flamegraphs(&results.join(&dir), &format!("{prefix}/{dir}"))?;
            // The happy scenario's second instrument, beside its throughput.
            let cpu = crate::cpu::Published::read(&results.join(&dir))?;
            let cpu_pairs = cpu
                .as_ref()
                .and_then(|cpu| cpu.reports.first())
                .map(|report| report.plan.pairs);
            writeln!(out, "### {title}\n")?;
            writeln!(out, "{}\n", headline(&summary))?;
            writeln!(
                out,
                "{}; [summary]({prefix}/{dir}/summary.md), [chart]({prefix}/{dir}/chart.svg), \
                 command `{}`.{}\n",
                provenance(&summary),
                command(&summary, &dir, !flamegraphs.is_empty(), cpu_pairs),
                clients(&summary),
            )?;
            if !flamegraphs.is_empty() {
                writeln!(
                    out,
                    "CPU flamegraphs of the first run of each side, over its whole load: {}.\n",
                    flamegraphs.join(", ")
                )?;
            }
            out.push_str(&summary::markdown_table(&summary));
            out.push('\n');
            if let Some(cpu) = cpu {
                for report in &cpu.reports {
                    writeln!(out, "{}", report.markdown())?;
                }
            }
        }
    }
    Ok(out)
}

/// The published sides whose answers docs/experiment.md tables: the results folder and
/// the side.
pub const ANSWER_ROWS: &[(&str, &str)] = &[
    ("seed", "legacy"),
    ("seed", "propagate"),
    ("saturation", "legacy"),
    ("saturation", "propagate"),
    ("pool-queue", "legacy"),
    ("pool-queue", "propagate"),
    ("happy-runtime-metrics", "metrics-on"),
];

/// docs/experiment.md's answers block: per published side, the four figures the answer
/// is decided from (medians of its runs) and the answer.
pub fn answers_table(results: &Path, prefix: &str) -> anyhow::Result<String> {
    let mut out = String::from(
        "| run | orders-service workers busy | catalog-service workers busy | catalog call, \
         mean (orders' view) | pool pending, mean | the metrics say | commit |\n\
         | --- | ---: | ---: | ---: | ---: | --- | --- |\n",
    );
    for &(dir, side) in ANSWER_ROWS {
        let Some(summary) = read(&results.join(dir))? else {
            continue;
        };
        let figure = |name: &str, decimals: usize, unit: &str| {
            summary
                .get(side, name)
                .map_or("-".to_owned(), |s| format!("{:.decimals$}{unit}", s.median))
        };
        writeln!(
            out,
            "| [`{dir}`]({prefix}/{dir}/summary.md), {side} | {} | {} | {} | {} | {} | `{}` |",
            figure("orders_busy_ratio", 2, ""),
            figure("catalog_busy_ratio", 2, ""),
            figure("catalog_call_mean_ms", 0, " ms"),
            figure("pending_mean", 1, ""),
            summary.answers.get(side).map_or("-", String::as_str),
            summary.commit,
        )?;
    }
    Ok(out)
}

/// The README's faults block: one line each for the published `partition` (the modes,
/// and the session bounds off against on), `stragglers`, `tight` and `outage` runs,
/// their headline and a link to their summary.
pub fn faults(results: &Path, prefix: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    for (dir, what) in [
        (
            "partition",
            "The link to PostgreSQL cut for 20 s under the goodput load",
        ),
        (
            "partition-session-bounds",
            "The same cut, both sides in propagate, the sessions' bounds off against on",
        ),
        ("stragglers-hedging", "Hedging off against on"),
        (
            "tight-hedge-deadline",
            "Hedging without the deadline rule against with it",
        ),
        (
            "outage-hedging",
            "An outage of the catalog, hedging off against on",
        ),
    ] {
        let summary = read(&results.join(dir))?
            .with_context(|| format!("no docs/results/{dir}/summary.json: publish a {dir} run"))?;
        writeln!(
            out,
            "- {what} ([summary]({prefix}/{dir}/summary.md), commit `{}`): {}",
            summary.commit,
            headline(&summary)
        )?;
    }
    Ok(out)
}

/// The README's findings block: the technique's cost without a fault (`happy`, the
/// median of its pair ratios), what propagate's metrics answer in the `seed`,
/// `saturation` and `pool-queue` runs with the figures that decided it, and what the
/// runtime metrics cost; `experiment` links to docs/experiment.md.
pub fn findings(results: &Path, experiment: &str) -> anyhow::Result<String> {
    let published = |dir: &str| -> anyhow::Result<Summary> {
        read(&results.join(dir))?
            .with_context(|| format!("no docs/results/{dir}/summary.json: publish a {dir} run"))
    };
    let (happy, seed, saturation, queue, cost) = (
        published("happy")?,
        published("seed")?,
        published("saturation")?,
        published("pool-queue")?,
        published("happy-runtime-metrics")?,
    );
    let median = |summary: &Summary, name: &str| {
        summary
            .get("propagate", name)
            .map_or(f64::NAN, |s| s.median)
    };
    let answer = |summary: &Summary| {
        summary
            .answers
            .get("propagate")
            .cloned()
            .unwrap_or_else(|| "no answer".to_owned())
    };
    let fault = |summary: &Summary, name: &str| summary.load["fault"][name].as_u64().unwrap_or(0);
    let ratios = |summary: &Summary| {
        let pairs = summary.pair_ratios("created_per_s");
        let spread = crate::stats::spread(&pairs);
        let pick = |f: fn(&crate::stats::Spread) -> f64| spread.as_ref().map_or(f64::NAN, f);
        format!(
            "median of {} pairs {:.3} ({:.3} to {:.3})",
            pairs.len(),
            pick(|s| s.median),
            pick(|s| s.min),
            pick(|s| s.max)
        )
    };
    let cpu = crate::cpu::Published::read(&results.join("happy"))?
        .context("no docs/results/happy/cpu.json: publish a happy run")?;
    Ok(format!(
        "Without a fault (the `happy` scenario) the technique's cost: {} As throughput \
         propagate / legacy in adjacent runs (closed loop, the load generator on the same \
         two cores): {} ([the cost]({experiment}#the-cost-of-the-technique)).\n\n\
         From the services' metrics alone, in propagate mode: the `seed` run ({} ms of \
         catalog latency) reads *{}* (catalog calls {:.0} ms, catalog workers busy {:.2}); \
         the `saturation` run ({} ms of spinning per catalog call) *{}* (catalog workers \
         busy {:.2}, pool pending {:.1}); the `pool-queue` run ({} pool slots in front of a \
         {} ms catalog) *{}* ({:.1} calls waiting for a slot on average, calls {:.0} ms). \
         Exporting the tokio runtime metrics: throughput on / off, {} \
         ([the three answers]({experiment}#the-three-answers-from-real-runs)).",
        cpu_cost(&cpu),
        ratios(&happy),
        fault(&seed, "delay_ms"),
        answer(&seed),
        median(&seed, "catalog_call_mean_ms"),
        median(&seed, "catalog_busy_ratio"),
        fault(&saturation, "busy_ms"),
        answer(&saturation),
        median(&saturation, "catalog_busy_ratio"),
        median(&saturation, "pending_mean"),
        queue.load["pool_max_connections"].as_u64().unwrap_or(0),
        fault(&queue, "delay_ms"),
        answer(&queue),
        median(&queue, "pending_mean"),
        median(&queue, "catalog_call_mean_ms"),
        ratios(&cost),
    ))
}

/// The happy path's cost as CPU per order (`happy/cpu.json`): legacy / propagate, the
/// instrument's own A/A spread, and the latency a user feels.
fn cpu_cost(published: &crate::cpu::Published) -> String {
    use crate::cpu::CpuVersus;
    let spread = |s: Option<&crate::stats::Spread>| {
        s.map_or("n/a".to_owned(), |s| {
            format!("{:.3} ({:.3} to {:.3})", s.median, s.min, s.max)
        })
    };
    let (Some(modes), Some(aa)) = (
        published.report(CpuVersus::Modes),
        published.report(CpuVersus::Aa),
    ) else {
        return "no CPU per order published.".to_owned();
    };
    let ratio = |r: &crate::cpu::CpuReport, key: &str| spread(r.ratios.get(key));
    let adjusted = |r: &crate::cpu::CpuReport, key: &str| spread(r.adjusted.get(key));
    format!(
        "CPU per order at {} orders/s (orders-service, catalog-service and PostgreSQL), \
         legacy / propagate, median of {} pairs with the machine's speed taken out by a \
         control process {} (as read, {}); orders-service alone {}, PostgreSQL {}; the same \
         instrument with both sides in propagate (A/A) {} (as read, {}); p50 latency \
         propagate − legacy {} (commit `{}`).",
        modes.plan.rate,
        modes.plan.pairs,
        adjusted(modes, "total"),
        ratio(modes, "total"),
        adjusted(modes, "orders-service"),
        adjusted(modes, "PostgreSQL"),
        adjusted(aa, "total"),
        ratio(aa, "total"),
        modes
            .p50_difference_ms
            .map_or("n/a".to_owned(), |s| format!(
                "{:+.2} ms ({:+.2} to {:+.2})",
                s.median, s.min, s.max
            )),
        published.commit,
    )
}

/// Links to the flamegraphs in `dir/flamegraphs/` (`<side>-<service>.svg`), by name.
fn flamegraphs(dir: &Path, link_prefix: &str) -> anyhow::Result<Vec<String>> {
    let Ok(entries) = std::fs::read_dir(dir.join("flamegraphs")) else {
        return Ok(Vec::new());
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    names.sort();
    Ok(names
        .iter()
        .map(|n| {
            let label = n.trim_end_matches(".svg").replacen('-', " ", 1);
            format!("[{label}]({link_prefix}/flamegraphs/{n})")
        })
        .collect())
}

/// The summary in `dir`, or `None` when there is none.
fn read(dir: &Path) -> anyhow::Result<Option<Summary>> {
    let path = dir.join("summary.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let summary =
        serde_json::from_str(&text).with_context(|| format!("cannot parse {}", path.display()))?;
    Ok(Some(summary))
}

/// Which commit, build and number of runs.
fn provenance(summary: &Summary) -> String {
    let per = if summary.sides == summary::MODES {
        "mode"
    } else {
        "side"
    };
    format!(
        "Commit `{}`, {} build, {} run(s) per {per}, median (min–max)",
        summary.commit, summary.profile, summary.repeats
    )
}

/// The budget and how long clients wait, as the run's load recorded them (with a
/// leading space), or nothing.
fn clients(summary: &Summary) -> String {
    let ms = |key: &str| summary.load[key].as_u64();
    match (ms("budget_ms"), ms("timeout_ms")) {
        (Some(budget), Some(timeout)) => {
            format!(" Budget {budget} ms; clients give up after {timeout} ms.")
        }
        _ => String::new(),
    }
}

/// The command that publishes the run in `docs/results/<dir>`, with the pairs of its
/// CPU per order when they were not the default.
fn command(summary: &Summary, dir: &str, profiled: bool, cpu_pairs: Option<u32>) -> String {
    let mut options = String::new();
    if dir.ends_with("-admission-off") {
        options.push_str(" --admission off");
    }
    if dir.ends_with("-runtime-metrics") {
        options.push_str(" --versus runtime-metrics");
    }
    if dir.ends_with("-session-bounds") {
        options.push_str(" --versus session-bounds");
    }
    if dir.ends_with("-hedging") {
        options.push_str(" --versus hedging");
    }
    if dir.ends_with("-hedge-deadline") {
        options.push_str(" --versus hedge-deadline");
    }
    if profiled {
        options.push_str(" --profile-cpu");
    }
    if let Some(pairs) = cpu_pairs.filter(|&p| p != crate::cpu::CpuPlan::default().pairs) {
        options.push_str(&format!(" --cpu-pairs {pairs}"));
    }
    format!(
        "cargo xtask experiment {} --repeat {} --duration {}s{options} --out docs/results/{dir}",
        summary.scenario,
        summary.repeats,
        summary.load["duration"].as_f64().unwrap_or(0.0),
    )
}

/// `to` as a link written in `from` (both relative to the workspace), with `/`.
fn relative(from: &Path, to: &Path) -> String {
    let parts = |p: &Path| -> Vec<String> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect()
    };
    let from = parts(from.parent().unwrap_or(Path::new("")));
    let to = parts(to);
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out: Vec<String> = vec!["..".to_owned(); from.len() - common];
    out.extend(to[common..].iter().cloned());
    out.join("/")
}

/// The one sentence a reader wants from a scenario (and, where the summary has them,
/// what its metrics answer to "pool queue, slow downstream or saturated executor?").
fn headline(summary: &Summary) -> String {
    let mut line = main_headline(summary);
    let answers: Vec<String> = summary
        .sides
        .iter()
        .filter_map(|side| Some(format!("{side} *{}*", summary.answers.get(side)?)))
        .collect();
    if !answers.is_empty() && summary.sides == summary::MODES {
        write!(
            line,
            " Pool queue, slow downstream or saturated executor? The metrics alone say: {}.",
            answers.join(", ")
        )
        .expect("writing to a String cannot fail");
    }
    line
}

fn main_headline(summary: &Summary) -> String {
    let median = |mode, figure| summary.get(mode, figure).map_or(f64::NAN, |s| s.median);
    if summary.sides == ["metrics-off", "metrics-on"] {
        let pairs = summary.pair_ratios("created_per_s");
        let spread = crate::stats::spread(&pairs);
        return format!(
            "Throughput, runtime metrics on / off: median of the {} pair ratios {:.3} \
             ({:.3}–{:.3}; {:.0} / {:.0} orders/s).",
            pairs.len(),
            spread.map_or(f64::NAN, |s| s.median),
            spread.map_or(f64::NAN, |s| s.min),
            spread.map_or(f64::NAN, |s| s.max),
            median("metrics-on", "created_per_s"),
            median("metrics-off", "created_per_s"),
        );
    }
    let [a, b] = [summary.sides[0].as_str(), summary.sides[1].as_str()];
    match summary.scenario.as_str() {
        "stragglers" => {
            return format!(
                "With 1 % of catalog calls stalling a second: p99.9 {:.0} ms ({a}) and {:.0} ms \
                 ({b}); catalog attempts per order {:.3} and {:.3}; goodput {:.1} and {:.1} orders/s.",
                median(a, "p999_ms"),
                median(b, "p999_ms"),
                median(a, "attempts_per_order"),
                median(b, "attempts_per_order"),
                median(a, "goodput_per_s"),
                median(b, "goodput_per_s"),
            );
        }
        "tight" => {
            return format!(
                "Budgets of 20 to 120 ms: hedges and retries cut at the deadline {:.2}/s ({a}) \
                 and {:.2}/s ({b}); orders in time {:.2} % and {:.2} %; extra attempts refused \
                 by the deadline rule {:.2}/s and {:.2}/s.",
                median(a, "extra_attempts_cut_per_s"),
                median(b, "extra_attempts_cut_per_s"),
                median(a, "in_time_share") * 100.0,
                median(b, "in_time_share") * 100.0,
                median(a, "extra_refused_deadline_per_s"),
                median(b, "extra_refused_deadline_per_s"),
            );
        }
        "outage" => {
            return format!(
                "While the catalog refuses everything: {:.3} ({a}) and {:.3} ({b}) catalog calls \
                 per order; extra attempts refused by the deadline rule {:.2}/s and {:.2}/s.",
                median(a, "outage_calls_per_order"),
                median(b, "outage_calls_per_order"),
                median(a, "extra_refused_deadline_per_s"),
                median(b, "extra_refused_deadline_per_s"),
            );
        }
        _ => {}
    }
    if summary.scenario == "partition" {
        return format!(
            "The link to PostgreSQL cut mid-load: write transactions held their row locks \
             for at most {:.0} ms ({a}) and {:.0} ms ({b}); {:.0} and {:.0} were left on the \
             server without a client at once, {:.0} and {:.0} a second after the heal; \
             goodput after the heal {:.1} and {:.1} orders/s (before the cut {:.1} and {:.1}); \
             p99 {a} {:.0} ms, {b} {:.0} ms.",
            median(a, "longest_write_xact_ms"),
            median(b, "longest_write_xact_ms"),
            median(a, "clientless_xacts_peak"),
            median(b, "clientless_xacts_peak"),
            median(a, "clientless_xacts_after_heal"),
            median(b, "clientless_xacts_after_heal"),
            median(a, "goodput_after_heal_per_s"),
            median(b, "goodput_after_heal_per_s"),
            median(a, "goodput_before_cut_per_s"),
            median(b, "goodput_before_cut_per_s"),
            median(a, "p99_ms"),
            median(b, "p99_ms"),
        );
    }
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
        "saturation" => format!(
            "catalog-service's workers busy {:.2} (legacy) and {:.2} (propagate) of their time; \
             catalog pool pending at most {:.0} and {:.0}; p99 legacy {:.0} ms, propagate {:.0} ms.",
            median("legacy", "catalog_busy_ratio"),
            median("propagate", "catalog_busy_ratio"),
            median("legacy", "pending_peak"),
            median("propagate", "pending_peak"),
            median("legacy", "p99_ms"),
            median("propagate", "p99_ms")
        ),
        "pool-queue" => format!(
            "Calls waiting for one of orders-service's catalog pool slots, on average: {:.1} \
             (legacy) and {:.1} (propagate); the catalog call itself {:.0} and {:.0} ms; p99 \
             legacy {:.0} ms, propagate {:.0} ms.",
            median("legacy", "pending_mean"),
            median("propagate", "pending_mean"),
            median("legacy", "catalog_call_mean_ms"),
            median("propagate", "catalog_call_mean_ms"),
            median("legacy", "p99_ms"),
            median("propagate", "p99_ms")
        ),
        _ => format!(
            "p99: legacy {:.0} ms, propagate {:.0} ms.",
            median("legacy", "p99_ms"),
            median("propagate", "p99_ms")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- tables:begin -->";
    const END: &str = "<!-- tables:end -->";

    #[test]
    fn the_block_between_the_markers_is_replaced_and_the_rest_kept() {
        let text = format!("# Title\n\nBefore.\n\n{BEGIN}\nold table\nmore\n{END}\n\nAfter.\n");
        let new = replace_block(&text, "tables", "| a | b |\n").unwrap();
        assert_eq!(
            new,
            format!("# Title\n\nBefore.\n\n{BEGIN}\n\n| a | b |\n\n{END}\n\nAfter.\n")
        );
        // Idempotent: a second run changes nothing.
        assert_eq!(replace_block(&new, "tables", "| a | b |\n").unwrap(), new);
        // An empty block leaves the markers next to each other.
        assert_eq!(
            replace_block(&new, "tables", "").unwrap(),
            format!("# Title\n\nBefore.\n\n{BEGIN}\n{END}\n\nAfter.\n")
        );
    }

    #[test]
    fn missing_repeated_or_swapped_markers_are_errors() {
        assert!(replace_block("no markers\n", "tables", "x").is_err());
        assert!(
            replace_block(&format!("{BEGIN}\n{END}\n{BEGIN}\n{END}\n"), "tables", "x").is_err()
        );
        assert!(replace_block(&format!("{END}\n{BEGIN}\n"), "tables", "x").is_err());
        // A marker quoted inside a line is not a marker line.
        let quoted = format!("say `{BEGIN}`\n{BEGIN}\n{END}\n");
        assert!(
            replace_block(&quoted, "tables", "x")
                .unwrap()
                .starts_with("say `")
        );
        // Another block's markers are no markers of this one, and stay as they are.
        let two = format!("{BEGIN}\n{END}\n<!-- answers:begin -->\nold\n<!-- answers:end -->\n");
        let new = replace_block(&two, "answers", "new").unwrap();
        assert_eq!(
            new,
            format!("{BEGIN}\n{END}\n<!-- answers:begin -->\n\nnew\n\n<!-- answers:end -->\n")
        );
        assert!(replace_block("<!-- answers:begin -->\n", "tables", "x").is_err());
    }

    #[test]
    fn links_are_written_relative_to_the_file() {
        let results = Path::new("docs/results");
        assert_eq!(relative(Path::new("README.md"), results), "docs/results");
        assert_eq!(
            relative(Path::new("docs/experiment.md"), results),
            "results"
        );
        assert_eq!(
            relative(Path::new("k6/README.md"), results),
            "../docs/results"
        );
    }

    #[test]
    fn the_committed_results_make_both_blocks() {
        let results = crate::stack::workspace().join("docs/results");
        let brief = brief(&results, "docs/results").unwrap();
        assert!(brief.starts_with("Goodput: legacy "), "{brief}");
        assert_eq!(
            brief.lines().filter(|l| l.starts_with("| ")).count(),
            BRIEF_ROWS.len() + 2, // the header and its separator
            "{brief}"
        );
        let full = full(&results, "results").unwrap();
        assert!(full.contains("### `goodput`\n"), "{full}");
        assert!(full.contains("(results/goodput/summary.md)"), "{full}");
        assert!(
            full.contains("--admission off --out docs/results/seed-admission-off"),
            "{full}"
        );
        let table = answers_table(&results, "results").unwrap();
        assert_eq!(
            table.lines().count(),
            ANSWER_ROWS.len() + 2,
            "a row for every published side: {table}"
        );
        assert!(
            table.contains("| [`pool-queue`](results/pool-queue/summary.md), legacy |"),
            "{table}"
        );
        let sentence = findings(&results, "docs/experiment.md").unwrap();
        for answer in ["*slow downstream*", "*saturated executor", "*pool queue*"] {
            assert!(sentence.contains(answer), "{answer}: {sentence}");
        }
        assert!(!sentence.contains("NaN"), "{sentence}");
    }

    fn summary_of(scenario: &str, sides: [&str; 2], busy: f64) -> Summary {
        let runs: Vec<crate::run::ModeRun> = sides
            .iter()
            .map(|side| crate::run::ModeRun {
                mode: (*side).into(),
                repeat: 0,
                figures: crate::run::Figures {
                    created_per_s: 100.0,
                    orders_busy_ratio: Some(0.1),
                    catalog_busy_ratio: Some(busy),
                    catalog_call_mean_ms: Some(900.0),
                    ..Default::default()
                },
                samples: Vec::new(),
                seconds: Vec::new(),
                fault_removed_at: None,
                load_ended_at: 0.0,
                partition_at: None,
                held: Vec::new(),
            })
            .collect();
        let load = serde_json::json!({"budget_ms": 700, "duration": 20.0});
        Summary::new(scenario, "abc".into(), "release", load, sides, &runs)
    }

    #[test]
    fn headlines_state_the_metrics_answer_and_a_cost_comparison_its_pair_ratios() {
        let seed = summary_of("seed", summary::MODES, 0.05);
        let line = headline(&seed);
        assert!(line.starts_with("p99: legacy "), "{line}");
        assert!(
            line.ends_with(
                "The metrics alone say: legacy *slow downstream*, propagate *slow downstream*."
            ),
            "{line}"
        );
        let saturated = summary_of("saturation", summary::MODES, 0.97);
        assert!(
            headline(&saturated).contains("legacy *saturated executor (catalog-service)*"),
            "{}",
            headline(&saturated)
        );
        let queue = headline(&summary_of("pool-queue", summary::MODES, 0.05));
        assert!(
            queue.starts_with("Calls waiting for one of orders-service's catalog pool slots"),
            "{queue}"
        );
        let cost = summary_of("happy", ["metrics-off", "metrics-on"], 0.3);
        let line = headline(&cost);
        assert!(
            line.starts_with(
                "Throughput, runtime metrics on / off: median of the 1 pair ratios 1.000"
            ),
            "{line}"
        );
        assert!(!line.contains("metrics alone"), "{line}");
        assert_eq!(
            command(&cost, "happy-runtime-metrics", false, None),
            "cargo xtask experiment happy --repeat 1 --duration 20s --versus runtime-metrics \
             --out docs/results/happy-runtime-metrics"
        );
        assert!(command(&seed, "seed", true, None).contains(" --profile-cpu --out"));
        assert!(command(&seed, "seed", false, Some(60)).contains(" --cpu-pairs 60 --out"));
        assert!(!command(&seed, "seed", false, Some(20)).contains("--cpu-pairs"));
    }
}
