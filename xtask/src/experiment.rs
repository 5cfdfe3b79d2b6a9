//! `cargo xtask experiment`: legacy against propagate under the identical load, each on
//! a fresh database and fresh services, repeated with the order alternated; then the
//! summary and, with `--check`, the acceptance rules.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use test_support::PgCluster;

use crate::chart::{self, Series};
use crate::check::{self, Verdict};
use crate::cpu::{self, CpuPlan, CpuVersus};
use crate::k6;
use crate::prometheus::Prometheus;
use crate::run::{self, Context, ModeRun};
use crate::scenario::{Load, Scenario, Side, Versus};
use crate::stack::{self, Ports, workspace};
use crate::stats::alternate;
use crate::summary::{self, RunFigures, Summary};

/// The experiment's command line.
#[derive(Debug, clap::Args)]
pub struct ExperimentArgs {
    /// What to run (docs/design.md §9).
    #[arg(value_enum, default_value = "goodput")]
    pub scenario: Scenario,
    /// Runs per mode; the order alternates (legacy first, then propagate first, ...).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Build profile of the services: `dev` (the default: the tests' build, so the first
    /// run and `cargo test` after it compile each dependency once; dependencies are
    /// optimized, our crates are not) or `release` (the published figures). `happy`,
    /// which prices CPU, defaults to `release`.
    #[arg(long, value_parser = ["release", "dev"])]
    pub profile: Option<String>,
    /// Do not run `cargo build` first.
    #[arg(long)]
    pub no_build: bool,
    /// Length of each load, e.g. `30s`, `2m` (default: the scenario's).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Closed-loop users instead of the scenario's (seed, mixed, happy).
    #[arg(long)]
    pub vus: Option<u32>,
    /// Open-model arrivals per second instead of the scenario's (goodput, recovery).
    #[arg(long)]
    pub rate: Option<u32>,
    /// orders-service's catalog pool slots (`CATALOG_POOL_MAX_CONNECTIONS`) instead of
    /// the scenario's 50: a few slots make a pool queue in front of a fast catalog.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pool_slots: Option<u32>,
    /// Orders with no fault before each measured load, e.g. `3s`.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub warm_up: Duration,
    /// The budget every order carries, ms.
    #[arg(long, default_value_t = 700)]
    pub budget: u64,
    /// How late past the budget propagate's p99 may be, ms (default: 50, or 100 for a
    /// `dev` build, whose own code is unoptimized).
    #[arg(long)]
    pub margin: Option<u64>,
    /// orders-service's deadline-aware admission (`CATALOG_ADMISSION`) in every run:
    /// `predict` (the default) or `off`, to measure what admission adds.
    #[arg(long, default_value = "predict", value_parser = ["predict", "off"])]
    pub admission: String,
    /// What the two sides differ in: the deadline mode (`modes`, legacy against
    /// propagate), or the runtime metrics (`runtime-metrics`: both in propagate, the
    /// services' `tokio_*` families off against on, to measure what they cost).
    #[arg(long, value_enum, default_value = "modes")]
    pub versus: Versus,
    /// Record a CPU profile of each service during every load (the services are built
    /// with their `profiling` feature) and keep the first run's of each side as
    /// flamegraphs beside the summary.
    #[arg(long)]
    pub profile_cpu: bool,
    /// Pairs of segments (3 s each, in both comparisons) of the `happy` scenario's CPU
    /// per order. Each comparison takes about 8 s a pair.
    #[arg(long, default_value_t = CpuPlan::default().pairs,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub cpu_pairs: u32,
    /// Fail (exit 1) when an acceptance rule does not hold.
    #[arg(long)]
    pub check: bool,
    /// Run a real Prometheus beside the services and check every dashboard query.
    #[arg(long)]
    pub prometheus: bool,
    /// Where to write (default: `results/<scenario>`); `docs/results/<scenario>` publishes.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl ExperimentArgs {
    /// The build profile: as given, else the scenario's.
    pub fn profile(&self) -> &str {
        match (&self.profile, self.scenario) {
            (Some(profile), _) => profile,
            (None, Scenario::Happy) => "release",
            (None, _) => "dev",
        }
    }

    /// The p99 margin: as given, else the profile's.
    pub fn margin(&self) -> u64 {
        self.margin
            .unwrap_or(if self.profile() == "dev" { 100 } else { 50 })
    }
}

/// `30s`, `2m`, `1m30s`, `500ms`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (mut total, mut number) = (0u64, String::new());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number
            .parse()
            .map_err(|_| format!("bad duration {text:?}"))?;
        number.clear();
        total += match (c, chars.peek()) {
            ('m', Some('s')) => (chars.next(), n).1,
            ('m', _) => n * 60_000,
            ('s', _) => n * 1000,
            ('h', _) => n * 3_600_000,
            _ => return Err(format!("bad duration {text:?} (use e.g. 30s, 2m, 500ms)")),
        };
    }
    if !number.is_empty() || total == 0 {
        return Err(format!("bad duration {text:?} (use e.g. 30s, 2m, 500ms)"));
    }
    Ok(Duration::from_millis(total))
}

/// Runs the experiment; `Ok(false)` when `--check` found a rule broken.
pub async fn experiment(args: ExperimentArgs) -> anyhow::Result<bool> {
    let out = args.out.clone().unwrap_or_else(|| {
        let name = format!("{}{}", args.scenario.name(), args.versus.suffix());
        workspace().join("results").join(name)
    });
    // Stamped before anything is written: the code as it was when the run started.
    let commit = stack::commit();
    let ctx = prepare(&args, &out).await?;
    let prometheus = match args.prometheus {
        true => Some(Prometheus::start(&ctx.ports, &out.join("runs/prometheus")).await?),
        false => None,
    };
    let sides = args.versus.sides();
    let runs = run_all(&ctx, &sides, args.repeat as usize).await?;
    // Two seconds before the last load ended: the services up, a final fault still on.
    let at = runs.last().map_or(0.0, |r| r.load_ended_at) - 2.0;
    let delay = ctx
        .load
        .fault
        .filter(|f| f.delay_ms > 0 && ctx.load.fault_removed_after.is_none());
    let prometheus_problems = match &prometheus {
        Some(p) => p.check_dashboards(at, delay.is_some()).await?,
        None => Vec::new(),
    };
    let summary = Summary::new(
        &args.scenario.name(),
        commit,
        args.profile(),
        serde_json::to_value(&ctx.load)?,
        sides.clone().map(|s| s.name),
        runs.iter().map(RunFigures::from),
    );
    let mut verdicts = check::check(&summary, ctx.load.budget_ms as f64, args.margin() as f64);
    verdicts.extend(prometheus_problems.iter().map(|p| Verdict {
        rule: "dashboard query".into(),
        ok: false,
        detail: p.clone(),
    }));
    write_results(&out, &summary, &runs, &ctx.load, &verdicts)?;
    if args.scenario == Scenario::Happy && args.versus == Versus::Modes {
        // Throughput on two cores prices the load generator as much as the services;
        // CPU per order at a fixed rate is the figure that can see a few per cent.
        cpu_per_order(&ctx, &out, &summary.commit, args.cpu_pairs).await?;
    }
    if args.profile_cpu {
        keep_flamegraphs(&out, &sides)?;
    }
    print_report(&summary, &verdicts, &out);
    Ok(!args.check || verdicts.iter().all(|v| v.ok))
}

/// The `happy` scenario's second instrument, [`cpu`]: legacy against propagate, and
/// propagate against itself (the instrument's spread); its table added to `summary.md`.
async fn cpu_per_order(ctx: &Context, out: &Path, commit: &str, pairs: u32) -> anyhow::Result<()> {
    let versus = [CpuVersus::Modes, CpuVersus::Aa];
    let plan = CpuPlan {
        pairs,
        ..CpuPlan::default()
    };
    let reports = cpu::measure_all(&ctx.profile, &ctx.cluster, &ctx.k6, &versus, plan, out).await?;
    cpu::write(out, commit, &ctx.profile, &reports)?;
    let mut text = std::fs::read_to_string(out.join("summary.md"))?;
    text.push_str("\n## CPU per order\n\n");
    for report in &reports {
        text.push_str(&report.markdown());
        text.push('\n');
        println!("{}", report.markdown());
    }
    std::fs::write(out.join("summary.md"), text)?;
    Ok(())
}

/// Builds, finds k6, starts PostgreSQL, picks the ports.
async fn prepare(args: &ExperimentArgs, out: &Path) -> anyhow::Result<Context> {
    if !args.no_build {
        let features = args.profile_cpu.then_some("profiling");
        stack::build_services(args.profile(), features.as_slice())?;
    }
    let k6 = k6::ensure_k6()?;
    if out.join("runs").exists() {
        std::fs::remove_dir_all(out.join("runs"))?;
    }
    std::fs::create_dir_all(out.join("runs"))?;
    let cluster = tokio::task::spawn_blocking(PgCluster::start).await??;
    Ok(Context {
        profile: args.profile().to_owned(),
        cluster,
        ports: Ports::free(),
        k6,
        load: args
            .scenario
            .load(args.duration, args.budget)
            .with_overrides(args.vus, args.rate, args.pool_slots),
        margin_ms: args.margin(),
        out: out.join("runs"),
        warm_up: args.warm_up,
        admission: args.admission.clone(),
        profile_cpu: args.profile_cpu,
    })
}

/// Every repeat, both sides each, the order [`alternate`]d.
async fn run_all(ctx: &Context, sides: &[Side; 2], repeats: usize) -> anyhow::Result<Vec<ModeRun>> {
    let mut runs = Vec::new();
    for repeat in 0..repeats {
        let order = alternate(repeat, [&sides[0], &sides[1]]);
        eprintln!(
            "{} run {}/{repeats}: {} then {}",
            ctx.load.scenario.name(),
            repeat + 1,
            order[0].name,
            order[1].name
        );
        for side in order {
            runs.push(run::run_mode(ctx, side, repeat).await?);
        }
    }
    Ok(runs)
}

/// The first run's flamegraphs of each side, as `flamegraphs/<side>-<service>.svg`.
fn keep_flamegraphs(out: &Path, sides: &[Side; 2]) -> anyhow::Result<()> {
    let dir = out.join("flamegraphs");
    std::fs::create_dir_all(&dir)?;
    for side in sides {
        for service in ["orders", "catalog"] {
            let from = out
                .join("runs")
                .join(format!("run-0-{}", side.name))
                .join(format!("flamegraph-{service}.svg"));
            let to = dir.join(format!("{}-{service}.svg", side.name));
            std::fs::copy(&from, &to).with_context(|| format!("{}", from.display()))?;
        }
    }
    Ok(())
}

/// `summary.json`, `summary.md`, `timeseries.json`, `chart.svg` and the k6 summaries:
/// small files that can be committed (samples and logs stay under `runs/`).
fn write_results(
    out: &Path,
    summary: &Summary,
    runs: &[ModeRun],
    load: &Load,
    verdicts: &[Verdict],
) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(summary)? + "\n";
    std::fs::write(out.join("summary.json"), json)?;
    let series: Vec<Series> = runs.iter().map(|run| Series::of(run, load)).collect();
    let json = serde_json::to_string(&series)? + "\n";
    std::fs::write(out.join("timeseries.json"), json)?;
    std::fs::write(out.join("chart.svg"), chart::svg(summary, &series)?)?;
    let json = serde_json::to_string(runs)? + "\n";
    std::fs::write(out.join("runs/timeseries.json"), json)?;
    std::fs::write(out.join("summary.md"), summary_markdown(summary, verdicts))?;
    std::fs::create_dir_all(out.join("k6"))?;
    for run in runs {
        let name = format!("run-{}-{}", run.repeat, run.mode);
        let from = out.join("runs").join(&name).join("k6-summary.json");
        std::fs::copy(&from, out.join("k6").join(format!("{name}.json")))
            .with_context(|| format!("{}", from.display()))?;
    }
    Ok(())
}

/// The markdown summary: what ran, the table, the checks.
pub fn summary_markdown(summary: &Summary, verdicts: &[Verdict]) -> String {
    let mut text = format!(
        "# Experiment `{}`\n\nCommit `{}`, {} build, {} run(s) per side (median, min–max), {} against {}.\n\nLoad: `{}`\n\n",
        summary.scenario,
        summary.commit,
        summary.profile,
        summary.repeats,
        summary.sides[0],
        summary.sides[1],
        summary.load
    );
    let answers = summary::answers_markdown(summary);
    if !answers.is_empty() {
        text.push_str(&answers);
        text.push('\n');
    }
    text.push_str(&summary::key_table(summary));
    text.push_str("\nEvery figure:\n\n");
    text.push_str(&summary::markdown_table(summary));
    let pairs = summary.pair_ratios("created_per_s");
    if summary.sides != summary::MODES && !pairs.is_empty() {
        text.push_str(&format!(
            "\n201 created per s, {} / {}, per repeat (adjacent runs): {}\n",
            summary.sides[1],
            summary.sides[0],
            pairs
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    text.push_str("\n| check | result | detail |\n| --- | --- | --- |\n");
    for v in verdicts {
        let result = if v.ok { "pass" } else { "FAIL" };
        text.push_str(&format!("| {} | {result} | {} |\n", v.rule, v.detail));
    }
    text
}

fn print_report(summary: &Summary, verdicts: &[Verdict], out: &Path) {
    println!("\n{}", summary::key_table(summary));
    println!("every figure: {}", out.join("summary.md").display());
    for (side, answer) in &summary.answers {
        println!("pool queue, slow downstream or saturated executor? {side}: {answer}");
    }
    for v in verdicts {
        let result = if v.ok { "PASS" } else { "FAIL" };
        println!("{result} {}: {}", v.rule, v.detail);
    }
    println!("\nresults in {} (the picture: chart.svg)", out.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("x").is_err());
    }
}
