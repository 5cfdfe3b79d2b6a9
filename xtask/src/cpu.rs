//! CPU per order: what the technique costs the machine when nothing is slow, at a fixed
//! open-loop rate well below saturation (docs/experiment.md, "How the cost is priced").
//!
//! One stack, orders-service's mode switched at run time between the sides; after each
//! switch a settling pause, then a segment in which a [`Meter`] reads the CPU time of
//! orders-service, catalog-service and PostgreSQL, and the largest order id counts the
//! orders. Pairs alternate which side goes first; the figure is the median of the pairs'
//! ratios, and the same divided by the control's (`cpu/reference.rs`): the machine's speed
//! taken out. The A/A run prices the instrument's own spread.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use sqlx::Connection as _;
use test_support::PgCluster;

use crate::meter::Meter;
use crate::scenario::{Model, Scenario};
use crate::stack::{Ports, ServiceEnv, Services, fresh_database, url, workspace};
use crate::stats::{Request, Spread, alternate, median_range, quantile, spread, unix_ms};
use reference::Reference;

mod reference;

/// What the two sides of a CPU run are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuVersus {
    /// legacy against propagate: the technique's cost.
    Modes,
    /// propagate against propagate: the instrument's own spread.
    Aa,
}

impl CpuVersus {
    /// The two sides: their names and the mode each switches orders-service to.
    pub fn sides(self) -> [(&'static str, &'static str); 2] {
        match self {
            Self::Modes => [("legacy", "legacy"), ("propagate", "propagate")],
            Self::Aa => [("propagate-a", "propagate"), ("propagate-b", "propagate")],
        }
    }
}

/// How a CPU run is shaped: orders/s (open loop), pairs, each segment's length, the pause
/// after each switch, the orders before the first segment, every order's budget.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CpuPlan {
    pub rate: u32,
    pub pairs: u32,
    #[serde(with = "crate::stats::secs")]
    pub segment: Duration,
    #[serde(with = "crate::stats::secs")]
    pub settle: Duration,
    #[serde(with = "crate::stats::secs")]
    pub warm_up: Duration,
    pub budget_ms: u64,
}

impl Default for CpuPlan {
    /// Well below what two cores serve; short segments, so the machine's own drift is
    /// nearly the same within a pair, and many of them for the median.
    fn default() -> Self {
        Self {
            rate: 500,
            pairs: 20,
            segment: Duration::from_secs(3),
            settle: Duration::from_secs(1),
            warm_up: Duration::from_secs(5),
            budget_ms: 700,
        }
    }
}

/// The processes whose CPU an order costs, in table order.
pub const PROCESSES: [&str; 3] = ["orders-service", "catalog-service", "PostgreSQL"];

/// One segment of a pair and a side: its length (s), orders created (from the table),
/// CPU ms per order per process of [`PROCESSES`] and in all, latency (ms), non-201s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub pair: usize,
    pub side: String,
    pub orders: u64,
    pub seconds: f64,
    pub cpu_ms_per_order: [f64; 3],
    pub total_ms_per_order: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub not_created: u64,
    /// The control's CPU per call in the segment, ms (NaN when it answered none; 0 in
    /// runs made before there was a control).
    #[serde(default)]
    pub reference_ms_per_call: f64,
}

/// Per side, a spread per figure.
type BySide = BTreeMap<String, BTreeMap<String, Spread>>;

/// A CPU run: comparison, sides (first over second in ratios), plan, segments, figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuReport {
    pub versus: CpuVersus,
    pub sides: [String; 2],
    pub plan: CpuPlan,
    /// Where CPU time was read: `cgroup` (cpuacct, ns) or `proc` (clock ticks).
    pub source: String,
    /// Every segment, in the order they ran.
    pub segments: Vec<Segment>,
    /// Per pair, CPU per order of the first side over the second's: per process,
    /// `total`, and `reference` (the control's CPU per call: 1 but for the machine).
    pub ratios: BTreeMap<String, Spread>,
    /// Per pair, the ratio divided by the control's: the machine's speed taken out.
    /// Per process and `total`; empty in runs made before there was a control.
    #[serde(default)]
    pub adjusted: BTreeMap<String, Spread>,
    /// Per side, CPU per order, ms: per process, `total`, and `reference` (per call);
    /// p50 and p99 latency, ms.
    pub per_order: BySide,
    pub latency: BySide,
    /// Per pair, the second side's p50 minus the first's, ms.
    pub p50_difference_ms: Option<Spread>,
    pub k6_exit: i32,
}

impl CpuReport {
    /// A Markdown table of the report.
    pub fn markdown(&self) -> String {
        let [a, b] = &self.sides;
        let median = |by_side: &BySide, side: &str, what: &str| {
            by_side
                .get(side)
                .and_then(|m| m.get(what))
                .map_or(f64::NAN, |s| s.median)
        };
        let shown = |s: Option<&Spread>| median_range(s.copied(), 3);
        let mut out = format!(
            "CPU per order at {} orders/s, open loop ({} pairs of {} s, {a} then {b} alternating; \
             median of the pairs, min to max; the last column divides each pair's ratio by \
             the control's, a catalog-service called directly at the same rate):\n\n\
             | CPU per order, ms | {a} | {b} | {a} / {b} | {a} / {b}, the machine's speed taken out |\n\
             | --- | ---: | ---: | --- | --- |\n",
            self.plan.rate,
            self.plan.pairs,
            self.plan.segment.as_secs_f64(),
        );
        let rows = PROCESSES.map(|p| (p, p)).into_iter();
        for (name, key) in rows.chain([("all three", "total")]) {
            out.push_str(&format!(
                "| {name} | {:.3} | {:.3} | {} | {} |\n",
                median(&self.per_order, a, key),
                median(&self.per_order, b, key),
                shown(self.ratios.get(key)),
                shown(self.adjusted.get(key)),
            ));
        }
        out.push_str(&format!(
            "| the control, ms per call | {:.3} | {:.3} | {} | |\n",
            median(&self.per_order, a, "reference"),
            median(&self.per_order, b, "reference"),
            shown(self.ratios.get("reference")),
        ));
        let latency = |side: &str, q: &str| median(&self.latency, side, q);
        out.push_str(&format!(
            "| latency p50 / p99, ms | {:.2} / {:.2} | {:.2} / {:.2} | p50 {b} − {a}: {} | |\n",
            latency(a, "p50"),
            latency(a, "p99"),
            latency(b, "p50"),
            latency(b, "p99"),
            self.p50_difference_ms.map_or("n/a".to_owned(), |s| format!(
                "{:+.2} ms ({:+.2} to {:+.2})",
                s.median, s.min, s.max
            ))
        ));
        out
    }
}

/// What is read at each end of a segment: the CPU time (ns) of each process of
/// [`PROCESSES`] and of the control, and the calls the control has answered.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at_ms: u64,
    orders: u64,
    cpu_ns: [u64; 3],
    reference_ns: u64,
    reference_calls: u64,
}

/// Reads the orders created so far and the [`Reading`] (the control: the meter's fourth).
async fn read(
    meter: &Meter,
    reference: &Reference,
    conn: &mut sqlx::PgConnection,
) -> anyhow::Result<Reading> {
    let orders: Option<i64> = sqlx::query_scalar("SELECT max(id) FROM orders")
        .fetch_one(&mut *conn)
        .await?;
    let reference_calls = reference.answered();
    let [orders_ns, catalog_ns, postgres_ns, reference_ns] = meter.read()?[..] else {
        anyhow::bail!("the meter reads four processes");
    };
    Ok(Reading {
        at_ms: unix_ms(),
        orders: orders.unwrap_or(0).max(0) as u64,
        cpu_ns: [orders_ns, catalog_ns, postgres_ns],
        reference_ns,
        reference_calls,
    })
}

/// Switches orders-service's mode.
async fn switch(orders_admin: &str, mode: &str) -> anyhow::Result<()> {
    let url = format!("{orders_admin}/admin/mode");
    reqwest::Client::new()
        .put(&url)
        .json(&serde_json::json!({ "mode": mode }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("PUT {url}"))?;
    Ok(())
}

/// Runs one CPU comparison on a stack of its own, writing its logs under `dir`.
pub async fn measure(
    profile: &str,
    cluster: &PgCluster,
    k6: &Path,
    versus: CpuVersus,
    plan: CpuPlan,
    dir: &Path,
) -> anyhow::Result<CpuReport> {
    std::fs::create_dir_all(dir)?;
    let name = format!("cpu_{versus:?}").to_lowercase();
    let database_url = fresh_database(cluster, &name).await?;
    let env = ServiceEnv {
        orders: vec![
            ("DEADLINE_MODE".into(), "propagate".into()),
            ("LOG_FORMAT".into(), "text".into()),
            ("RUST_LOG".into(), "warn".into()),
        ],
        catalog: vec![("RUST_LOG".into(), "warn".into())],
        ..ServiceEnv::default()
    };
    let ports = Ports::free();
    let services = Services::start(profile, ports, database_url.clone(), &env, dir).await?;
    let reference = Reference::start(profile, dir, plan.rate).await?;
    let meter = Meter::new(&[
        services.orders.pid(),
        services.catalog.pid(),
        cluster.postmaster_pid()?,
        reference.pid(),
    ]);
    let mut watcher = sqlx::PgConnection::connect(&database_url).await?;
    let sides = versus.sides();
    let per_segment = plan.settle + plan.segment;
    let length = plan.warm_up + per_segment * (2 * plan.pairs) + Duration::from_secs(1);
    let mut load = Scenario::Happy.load(Some(length), plan.budget_ms);
    load.model = Model::Open { rate: plan.rate };
    let k6_task = {
        let (k6, load, dir) = (k6.to_path_buf(), load.clone(), dir.to_path_buf());
        let url = url(ports.orders);
        // `legacy` for k6's thresholds only: the run holds both modes, and a p99 over both
        // says nothing; every answer's status is still checked.
        tokio::spawn(async move { crate::k6::run(&k6, &load, "legacy", &url, 0, &dir).await })
    };
    // The schedule is the instrument: each segment is a fixed length of the load.
    tokio::time::sleep(plan.warm_up).await;
    let mut readings: Vec<(usize, &str, Reading, Reading)> = Vec::new();
    for pair in 0..plan.pairs as usize {
        for (side, mode) in alternate(pair, sides) {
            switch(&url(ports.orders_admin), mode).await?;
            tokio::time::sleep(plan.settle).await;
            let start = read(&meter, &reference, &mut watcher).await?;
            tokio::time::sleep(plan.segment).await;
            let end = read(&meter, &reference, &mut watcher).await?;
            // Without the control's calls the segment's speed is unknown: a broken run,
            // not one whose adjusted ratio quietly leaves pairs out.
            anyhow::ensure!(
                end.reference_calls > start.reference_calls,
                "the control answered no call in pair {}: see {}",
                pair + 1,
                dir.join("reference.log").display()
            );
            eprintln!(
                "  cpu pair {}/{}: {side:>11}: {} orders",
                pair + 1,
                plan.pairs,
                end.orders - start.orders
            );
            readings.push((pair, side, start, end));
        }
    }
    let k6_run = k6_task.await??;
    let _ = watcher.close().await;
    let source = meter.source();
    drop(meter);
    drop(reference);
    services.stop();
    Ok(report(
        versus,
        plan,
        source,
        &readings,
        &k6_run.requests,
        k6_run.exit_code,
    ))
}

/// The figures of the segments.
fn report(
    versus: CpuVersus,
    plan: CpuPlan,
    source: &str,
    readings: &[(usize, &str, Reading, Reading)],
    requests: &[Request],
    k6_exit: i32,
) -> CpuReport {
    let segments: Vec<Segment> = readings
        .iter()
        .map(|(pair, side, start, end)| {
            let orders = end.orders.saturating_sub(start.orders);
            let cpu = [0, 1, 2].map(|i| {
                let ms = end.cpu_ns[i].saturating_sub(start.cpu_ns[i]) as f64 / 1e6;
                ms / orders.max(1) as f64
            });
            let calls = end.reference_calls.saturating_sub(start.reference_calls);
            let reference_ms = end.reference_ns.saturating_sub(start.reference_ns) as f64 / 1e6;
            let reference_ms_per_call = match calls {
                0 => f64::NAN,
                calls => reference_ms / calls as f64,
            };
            let arrived: Vec<&Request> = requests
                .iter()
                .filter(|r| r.arrival_ms >= start.at_ms && r.arrival_ms < end.at_ms)
                .collect();
            let times: Vec<f64> = arrived
                .iter()
                .map(|r| r.elapsed_us as f64 / 1000.0)
                .collect();
            Segment {
                pair: *pair,
                side: (*side).to_owned(),
                orders,
                seconds: end.at_ms.saturating_sub(start.at_ms) as f64 / 1000.0,
                cpu_ms_per_order: cpu,
                total_ms_per_order: cpu.iter().sum(),
                p50_ms: quantile(&times, 0.5).unwrap_or(f64::NAN),
                p99_ms: quantile(&times, 0.99).unwrap_or(f64::NAN),
                not_created: arrived.iter().filter(|r| r.status != 201).count() as u64,
                reference_ms_per_call,
            }
        })
        .collect();
    summarize(versus, plan, source, segments, k6_exit)
}

/// A report's figures from its segments: the pairs' ratios, and each side's own.
fn summarize(
    versus: CpuVersus,
    plan: CpuPlan,
    source: &str,
    segments: Vec<Segment>,
    k6_exit: i32,
) -> CpuReport {
    let sides = versus.sides().map(|(name, _)| name.to_owned());
    let of = |pair: usize, side: &str| segments.iter().find(|s| s.pair == pair && s.side == side);
    let pairs: Vec<(&Segment, &Segment)> = (0..plan.pairs as usize)
        .filter_map(|p| Some((of(p, &sides[0])?, of(p, &sides[1])?)))
        .collect();
    // The processes and `total`; `reference` is the control's CPU per call.
    let cpu = [&PROCESSES[..], &["total"]].concat();
    let keys = [&cpu[..], &["reference"]].concat();
    let value = |s: &Segment, key: &str| match key {
        "total" => s.total_ms_per_order,
        "reference" => s.reference_ms_per_call,
        "p50" => s.p50_ms,
        "p99" => s.p99_ms,
        process => s.cpu_ms_per_order[PROCESSES.iter().position(|p| *p == process).unwrap()],
    };
    let ratio = |(a, b): &(&Segment, &Segment), key: &str| value(a, key) / value(b, key);
    let ratios = spreads(&keys, |key| {
        pairs.iter().map(|pair| ratio(pair, key)).collect()
    });
    // A ratio that is not finite (a control that answered nothing) is left out.
    let adjusted = spreads(&cpu, |key| {
        pairs
            .iter()
            .map(|pair| ratio(pair, key) / ratio(pair, "reference"))
            .filter(|r| r.is_finite())
            .collect()
    });
    let mut per_order = BTreeMap::new();
    let mut latency = BTreeMap::new();
    for side in &sides {
        let mine: Vec<&Segment> = segments.iter().filter(|s| &s.side == side).collect();
        let values = |key: &str| mine.iter().map(|s| value(s, key)).collect();
        per_order.insert(side.clone(), spreads(&keys, values));
        latency.insert(side.clone(), spreads(&["p50", "p99"], values));
    }
    let differences: Vec<f64> = pairs.iter().map(|(a, b)| b.p50_ms - a.p50_ms).collect();
    CpuReport {
        versus,
        sides,
        plan,
        source: source.to_owned(),
        segments,
        ratios,
        adjusted,
        per_order,
        latency,
        p50_difference_ms: spread(&differences),
        k6_exit,
    }
}

/// The spread of `values(key)` for each of `keys` that has one.
fn spreads(keys: &[&str], values: impl Fn(&str) -> Vec<f64>) -> BTreeMap<String, Spread> {
    keys.iter()
        .filter_map(|key| Some(((*key).to_owned(), spread(&values(key))?)))
        .collect()
}

/// The pairs of several runs of one comparison as one report, as if one run had made
/// them all (how the docs pool runs of one build into one median). Each pair keeps its
/// sides and control; only their numbers change, so no two runs' pairs are taken for one.
pub fn pool(reports: &[&CpuReport]) -> anyhow::Result<CpuReport> {
    let Some(first) = reports.first() else {
        anyhow::bail!("no runs to pool");
    };
    let mut segments = Vec::new();
    let mut pairs = 0;
    for report in reports {
        anyhow::ensure!(
            report.versus == first.versus && report.plan.rate == first.plan.rate,
            "only runs of one comparison at one rate can be pooled"
        );
        let offset = pairs as usize;
        segments.extend(report.segments.iter().cloned().map(|mut segment| {
            segment.pair += offset;
            segment
        }));
        pairs += report.plan.pairs;
    }
    let plan = CpuPlan {
        pairs,
        ..first.plan
    };
    let sources: BTreeSet<&str> = reports.iter().map(|r| r.source.as_str()).collect();
    let sources = Vec::from_iter(sources).join(", ");
    let k6_exit = reports
        .iter()
        .map(|r| r.k6_exit)
        .find(|&e| e != 0)
        .unwrap_or(0);
    Ok(summarize(first.versus, plan, &sources, segments, k6_exit))
}

/// What `cpu.json` holds, read back by `cpu-pool`: the commit measured, the comparisons.
#[derive(Debug, Deserialize)]
struct Published {
    commit: String,
    reports: Vec<CpuReport>,
}

/// `cargo xtask cpu-pool`'s command line.
#[derive(Debug, clap::Args)]
pub struct CpuPoolArgs {
    /// The comparison to pool.
    #[arg(long, value_enum, default_value = "modes")]
    pub versus: CpuVersus,
    /// Folders holding a `cpu.json` each (what `cargo xtask cpu --out` or the `happy`
    /// experiment wrote).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
}

/// Runs `cargo xtask cpu-pool`: prints the pooled table, after the runs it pools.
pub fn pool_command(args: &CpuPoolArgs) -> anyhow::Result<()> {
    let mut reports = Vec::new();
    for dir in &args.dirs {
        let path = dir.join("cpu.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("no cpu.json in {}", dir.display()))?;
        let run: Published = serde_json::from_str(&text)
            .with_context(|| format!("cannot parse {}", path.display()))?;
        let report = run
            .reports
            .into_iter()
            .find(|r| r.versus == args.versus)
            .with_context(|| format!("{} has no {:?} comparison", dir.display(), args.versus))?;
        println!(
            "- {}: commit `{}`, {} pairs",
            dir.display(),
            run.commit,
            report.plan.pairs
        );
        reports.push(report);
    }
    let reports: Vec<&CpuReport> = reports.iter().collect();
    println!("\n{}", pool(&reports)?.markdown());
    Ok(())
}

/// `cargo xtask cpu`'s command line: the instrument alone.
#[derive(Debug, clap::Args)]
pub struct CpuArgs {
    /// What to compare: the modes, the instrument against itself (`aa`), or both.
    #[arg(long, value_enum)]
    pub versus: Option<CpuVersus>,
    /// Pairs of segments.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pairs: u32,
    /// Orders per second.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub rate: u32,
    /// Seconds per segment.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub segment: u64,
    /// Build profile of the services.
    #[arg(long, default_value = "release", value_parser = ["release", "dev"])]
    pub profile: String,
    /// Do not run `cargo build` first.
    #[arg(long)]
    pub no_build: bool,
    /// Where to write (default `results/cpu`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs `cargo xtask cpu`: the comparisons asked for; writes `cpu.json` and `cpu.md`.
pub async fn run(args: CpuArgs) -> anyhow::Result<Vec<CpuReport>> {
    let out = args.out.unwrap_or_else(|| workspace().join("results/cpu"));
    let commit = crate::stack::commit();
    if !args.no_build {
        crate::stack::build_services(&args.profile, &[])?;
    }
    let k6 = crate::k6::ensure_k6()?;
    let cluster = tokio::task::spawn_blocking(PgCluster::start).await??;
    let plan = CpuPlan {
        rate: args.rate,
        pairs: args.pairs,
        segment: Duration::from_secs(args.segment),
        ..CpuPlan::default()
    };
    let versus = match args.versus {
        Some(v) => vec![v],
        None => vec![CpuVersus::Modes, CpuVersus::Aa],
    };
    let reports = measure_all(&args.profile, &cluster, &k6, &versus, plan, &out).await?;
    write(&out, &commit, &args.profile, &reports)?;
    for report in &reports {
        println!("{}", report.markdown());
    }
    Ok(reports)
}

/// Each comparison in turn on a stack of its own, logs in `out/runs/cpu-<versus>`.
pub async fn measure_all(
    profile: &str,
    cluster: &PgCluster,
    k6: &Path,
    versus: &[CpuVersus],
    plan: CpuPlan,
    out: &Path,
) -> anyhow::Result<Vec<CpuReport>> {
    let mut reports = Vec::new();
    for &v in versus {
        let dir = out.join("runs").join(format!("cpu-{v:?}").to_lowercase());
        reports.push(measure(profile, cluster, k6, v, plan, &dir).await?);
    }
    Ok(reports)
}

/// `cpu.json` (every segment, for whoever wants to recompute) and `cpu.md` in `out`.
pub fn write(out: &Path, commit: &str, profile: &str, reports: &[CpuReport]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let json = serde_json::json!({"commit": commit, "profile": profile, "reports": reports});
    std::fs::write(out.join("cpu.json"), format!("{json:#}\n"))?;
    let text: Vec<String> = reports.iter().map(CpuReport::markdown).collect();
    let heading = format!("# CPU per order\n\nCommit `{commit}`, {profile} build.\n\n");
    std::fs::write(out.join("cpu.md"), heading + &text.join("\n"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Back-to-back segments of 1000 orders in 1 s, 2 s apart, each `(pair, side, CPU
    /// ticks of 10 ms per process, the control's speed in per cent)`: the control takes
    /// 1 ms a call at 100, on a machine that many per cent slower above it.
    fn chain(
        steps: &[(usize, &'static str, [u64; 3], u64)],
    ) -> Vec<(usize, &'static str, Reading, Reading)> {
        let mut ticks = [0; 3];
        let mut out = Vec::new();
        for (i, &(pair, side, used, speed)) in (0u64..).zip(steps) {
            let reading = |at_ms: u64, orders: u64, ticks: [u64; 3]| Reading {
                at_ms,
                orders,
                cpu_ns: ticks.map(|t| t * 10_000_000),
                reference_ns: at_ms * 1_000_000,
                reference_calls: at_ms,
            };
            let start = reading(i * 2000, i * 1000, ticks);
            ticks = [0, 1, 2].map(|p| ticks[p] + used[p]);
            let mut end = reading(i * 2000 + 1000, i * 1000 + 1000, ticks);
            end.reference_ns = start.reference_ns + 1_000_000 * 1000 * speed / 100;
            out.push((pair, side, start, end));
        }
        out
    }

    fn answer((arrival_ms, elapsed_us): (u64, u64)) -> Request {
        Request {
            arrival_ms,
            status: 201,
            elapsed_ms: elapsed_us / 1000,
            elapsed_us,
            budget_ms: None,
        }
    }

    fn plan(pairs: u32) -> CpuPlan {
        CpuPlan {
            pairs,
            ..CpuPlan::default()
        }
    }

    #[test]
    fn the_ratio_is_per_pair_cpu_per_order_first_side_over_second() {
        // 100 Hz: 80 ticks over 1000 orders is 0.8 ms an order.
        let readings = chain(&[
            (0, "legacy", [80, 20, 60], 100),
            (0, "propagate", [90, 20, 70], 100),
            (1, "propagate", [90, 20, 70], 100),
            (1, "legacy", [80, 20, 60], 100),
        ]);
        let requests = [(10, 1500), (20, 2500), (2010, 1700), (2020, 2600)].map(answer);
        let report = report(CpuVersus::Modes, plan(2), "proc", &readings, &requests, 0);
        let total = report.ratios["total"];
        // legacy 1.6 ms an order, propagate 1.8: 0.889 in both pairs.
        assert!((total.median - 1.6 / 1.8).abs() < 1e-9, "{total:?}");
        assert!((report.ratios["orders-service"].median - 0.8 / 0.9).abs() < 1e-9);
        assert_eq!(report.segments[0].orders, 1000);
        assert!((report.segments[0].p50_ms - 1.5).abs() < 1e-9);
        let difference = report.p50_difference_ms.unwrap();
        assert!((difference.median - 0.2).abs() < 1e-9, "{difference:?}");
        // The control ran at the same speed throughout: nothing to take out.
        assert!((report.ratios["reference"].median - 1.0).abs() < 1e-9);
        assert!((report.adjusted["total"].median - 1.6 / 1.8).abs() < 1e-9);
    }

    /// A segment whose orders cost `total` ms of CPU, the control 0.08 ms a call.
    fn segment(pair: usize, side: &str, total: f64) -> Segment {
        Segment {
            pair,
            side: side.to_owned(),
            orders: 1500,
            seconds: 3.0,
            cpu_ms_per_order: [total / 2.0, total / 4.0, total / 4.0],
            total_ms_per_order: total,
            p50_ms: 1.0,
            p99_ms: 2.0,
            not_created: 0,
            reference_ms_per_call: 0.08,
        }
    }

    /// A run of the modes whose pairs' ratios (legacy / propagate) are `ratios`.
    fn run_of(ratios: &[f64]) -> CpuReport {
        let plan = plan(ratios.len() as u32);
        let segments = ratios
            .iter()
            .enumerate()
            .flat_map(|(pair, ratio)| {
                [
                    segment(pair, "legacy", *ratio),
                    segment(pair, "propagate", 1.0),
                ]
            })
            .collect();
        summarize(CpuVersus::Modes, plan, "cgroup", segments, 0)
    }

    #[test]
    fn pooled_runs_are_one_run_of_all_their_pairs() {
        let (one, two) = (run_of(&[0.90]), run_of(&[0.95, 1.0]));
        assert!((one.adjusted["total"].median - 0.90).abs() < 1e-9);
        let pooled = pool(&[&one, &two]).unwrap();
        assert_eq!(pooled.plan.pairs, 3);
        // Three pairs, not two runs' first pairs taken for one pair.
        let pairs: BTreeSet<usize> = pooled.segments.iter().map(|s| s.pair).collect();
        assert_eq!(pairs.len(), 3);
        let adjusted = pooled.adjusted["total"];
        assert!((adjusted.median - 0.95).abs() < 1e-9, "{adjusted:?}");
        assert!((adjusted.min - 0.90).abs() < 1e-9 && (adjusted.max - 1.0).abs() < 1e-9);
    }

    #[test]
    fn only_runs_of_one_comparison_are_pooled() {
        let mut aa = run_of(&[1.0]);
        aa.versus = CpuVersus::Aa;
        assert!(pool(&[&run_of(&[0.9]), &aa]).is_err());
        assert!(pool(&[]).is_err());
    }

    #[test]
    fn the_machine_s_speed_is_taken_out_by_the_control_s_ratio() {
        // Both sides cost 1 ms an order, but the machine runs 25 % slower in the first
        // pair's legacy segment and in the second pair's propagate segment: everything,
        // the control too, takes 1.25 times the CPU there.
        let readings = chain(&[
            (0, "legacy", [125, 0, 0], 125),
            (0, "propagate", [100, 0, 0], 100),
            (1, "propagate", [125, 0, 0], 125),
            (1, "legacy", [100, 0, 0], 100),
        ]);
        let report = report(CpuVersus::Modes, plan(2), "proc", &readings, &[], 0);
        let raw = report.ratios["orders-service"];
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(raw.min, 0.8) && near(raw.max, 1.25), "{raw:?}");
        let adjusted = report.adjusted["orders-service"];
        assert!((adjusted.min - 1.0).abs() < 1e-9 && (adjusted.max - 1.0).abs() < 1e-9);
        assert!((report.segments[0].reference_ms_per_call - 1.25).abs() < 1e-9);
    }

    #[test]
    fn a_control_that_answered_nothing_leaves_the_pair_out_of_the_adjusted_ratio() {
        let mut readings = chain(&[
            (0, "legacy", [100, 0, 0], 100),
            (0, "propagate", [100, 0, 0], 100),
        ]);
        (readings[0].3.reference_calls, readings[0].3.reference_ns) = (0, 0);
        let report = report(CpuVersus::Modes, plan(1), "proc", &readings, &[], 0);
        assert!((report.ratios["total"].median - 1.0).abs() < 1e-9);
        assert!(report.segments[0].reference_ms_per_call.is_nan());
        let adjusted = &report.adjusted;
        assert!(!adjusted.contains_key("total"), "{adjusted:?}");
    }
}
