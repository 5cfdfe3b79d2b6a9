//! `cargo xtask backlog`: the queue hop under a backlog (docs/design.md §11). Shipments
//! arrive at twice what the workers can book for a stretch, then at half; legacy (jobs
//! without a deadline) against propagate, alternating, each on its own database. Every
//! figure but the answers' p99 is read from the queue's tables; the raw data beside them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use sqlx::PgPool;
use test_support::PgCluster;
use tokio::time::Instant;

use crate::stack::{Ports, ServiceEnv, Services, build_services, commit, fresh_database, url};
use crate::stats::{Spread, alternate, median_range, quantile, spread};

/// `cargo xtask backlog`.
#[derive(clap::Args, Debug)]
pub struct BacklogArgs {
    /// Which build of the services to run (`dev` is target/debug).
    #[arg(long, default_value = "dev", value_parser = ["dev", "release"])]
    pub profile: String,
    /// Use the binaries as they are instead of running `cargo build` first.
    #[arg(long)]
    pub no_build: bool,
    /// Pairs of runs, legacy and propagate, alternating which goes first.
    #[arg(long, default_value_t = 2)]
    pub pairs: u32,
    /// shipping-worker's workers; with `--work-ms`, the capacity (jobs/s).
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    /// How long one booking takes.
    #[arg(long, default_value_t = 50)]
    pub work_ms: u64,
    /// Seconds at twice the capacity.
    #[arg(long, default_value_t = 10)]
    pub stretch_s: u64,
    /// Seconds at half the capacity after the stretch.
    #[arg(long, default_value_t = 15)]
    pub normal_s: u64,
    /// Every caller's budget (`X-Request-Timeout-Ms`).
    #[arg(long, default_value_t = 1000)]
    pub budget_ms: u64,
    /// Where the raw data goes.
    #[arg(long, default_value = "results/backlog")]
    pub out: PathBuf,
    /// Fail unless propagate's median wasted share is at most 1 %, its goodput at least
    /// 1.5 times legacy's, and its queue drained within the budget (docs/design.md §11).
    #[arg(long)]
    pub check: bool,
}

/// How long past its budget a caller waits before it gives up (its answer counts at its
/// budget all the same).
const PATIENCE: Duration = Duration::from_millis(200);

/// One side's figures.
#[derive(Debug, Clone, Serialize)]
struct Figures {
    /// Worker time spent on jobs after their caller's budget was gone, of all worker time.
    wasted_share: f64,
    /// Jobs whose effect committed within their caller's budget, per second of load.
    goodput: f64,

    p99_ms: f64,
    /// The oldest queued job's age, at its largest.
    oldest_s: f64,
    /// From the stretch's end until no job of the stretch is queued.
    drain_s: f64,
}

/// One side's run, raw.
#[derive(Debug, Serialize)]
struct Run {
    mode: &'static str,
    figures: Figures,
    /// Each answer: seconds since the load began, status (0: the caller gave up), ms.
    answers: Vec<(f64, u16, f64)>,
    /// Every 100 ms: seconds since the load began, queued jobs, oldest job's age (s).
    samples: Vec<(f64, i64, f64)>,
}

/// Runs every pair and prints the table.
pub async fn backlog(args: &BacklogArgs) -> anyhow::Result<()> {
    if !args.no_build {
        build_services(&args.profile, &[])?;
    }
    let cluster = tokio::task::spawn_blocking(PgCluster::start).await??;
    let mut runs = Vec::new();
    for pair in 0..args.pairs {
        for mode in alternate(pair as usize, ["legacy", "propagate"]) {
            let run = side(&cluster, mode, args, runs.len()).await?;
            eprintln!("backlog: {mode}: {:?}", run.figures);
            runs.push(run);
        }
    }
    std::fs::create_dir_all(&args.out)?;
    let raw = args.out.join(format!("backlog-{}.json", commit()));
    std::fs::write(&raw, serde_json::to_string(&runs)?)?;
    println!("{}", table(&runs, args));
    println!("raw data: {}", raw.display());
    if args.check {
        let median = |figure| of(&runs, "propagate", figure).map_or(f64::NAN, |s| s.median);
        let (goodput, wasted) = (goodput_ratio(&runs), median(|f| f.wasted_share));
        let drain = median(|f| f.drain_s);
        anyhow::ensure!(
            wasted <= 0.01,
            "propagate's wasted share {wasted:.3} is above 1 %"
        );
        anyhow::ensure!(
            goodput >= 1.5,
            "goodput propagate / legacy {goodput:.2} is below 1.5"
        );
        let budget = args.budget_ms as f64 / 1000.0;
        anyhow::ensure!(
            drain <= budget,
            "propagate drained in {drain:.2} s, past the {budget} s budget"
        );
    }
    Ok(())
}

/// One side: services on a fresh database, the load, the drain, the table read.
async fn side(
    cluster: &PgCluster,
    mode: &'static str,
    args: &BacklogArgs,
    n: usize,
) -> anyhow::Result<Run> {
    let database = fresh_database(cluster, &format!("backlog_{n}")).await?;
    let env = ServiceEnv {
        orders: vec![
            ("DEADLINE_MODE".into(), mode.into()),
            ("DEADLINE_MAX_MS".into(), "60000".into()),
        ],
        shipping: vec![
            ("SHIPPING_WORKERS".into(), args.workers.to_string()),
            ("SHIPPING_WORK_MS".into(), args.work_ms.to_string()),
        ],
        ..ServiceEnv::default()
    };
    let logs = std::env::temp_dir().join(format!("backlog-{}-{n}", std::process::id()));
    let services =
        Services::start(&args.profile, Ports::free(), database.clone(), &env, &logs).await?;
    let pool = PgPool::connect(&database).await?;
    let order: i64 = sqlx::query_scalar(
        "INSERT INTO orders (sku, quantity, unit_price_cents, total_cents)
         VALUES ('SKU-00001', 1, 100, 100) RETURNING id",
    )
    .fetch_one(&pool)
    .await?;
    let orders = url(services.ports.orders);
    let target = format!("{orders}/api/orders/{order}/shipments");
    let capacity = f64::from(args.workers) * 1000.0 / args.work_ms as f64;
    let began = Instant::now();
    let stretch_end = Duration::from_secs(args.stretch_s);
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = tokio::spawn(sample(pool.clone(), began, samples.clone()));
    let answers = load(&target, capacity, args).await;
    // Wait until the oldest queued job was enqueued after the stretch (legacy: long).
    let end = stretch_end.as_secs_f64();
    let drained = |&(t, depth, age): &(f64, i64, f64)| t >= end && (depth == 0 || age < t - end);
    let give_up = Instant::now() + Duration::from_secs(120);
    while Instant::now() < give_up && !samples.lock().unwrap().iter().any(drained) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    let drain_s = samples
        .iter()
        .find(|s| drained(s))
        .map_or(f64::NAN, |(t, _, _)| t - end);
    let (wasted_share, done_in_time): (Option<f64>, i64) = sqlx::query_as(TABLE_FIGURES)
        .bind(args.budget_ms as f64)
        .fetch_one(&pool)
        .await
        .context("the queue's tables")?;
    let latencies: Vec<f64> = answers.iter().map(|(_, _, ms)| *ms).collect();
    let figures = Figures {
        wasted_share: wasted_share.unwrap_or(0.0),
        goodput: done_in_time as f64 / (args.stretch_s + args.normal_s) as f64,
        p99_ms: quantile(&latencies, 0.99).unwrap_or(f64::NAN),
        oldest_s: samples.iter().map(|(_, _, age)| *age).fold(0.0, f64::max),
        drain_s,
    };
    pool.close().await;
    services.stop();
    Ok(Run {
        mode,
        figures,
        answers,
        samples,
    })
}

/// From the tables: the share of worker time spent after the caller's budget (each
/// attempt's part past it), and the jobs done within their caller's budget.
const TABLE_FIGURES: &str = "
WITH a AS (
    SELECT a.started_at, a.ended_at, j.enqueued_at + $1::float8 * interval '1 millisecond' AS gone
    FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id
    WHERE a.ended_at IS NOT NULL
)
SELECT sum(extract(epoch FROM greatest(ended_at - greatest(started_at, gone), interval '0')))::float8
         / nullif(sum(extract(epoch FROM ended_at - started_at)), 0)::float8,
       (SELECT count(*) FROM queue_jobs
        WHERE state = 'done' AND finished_at <= enqueued_at + $1::float8 * interval '1 millisecond')
FROM a";

/// Open-model arrivals: twice `capacity` per second for the stretch, then half of it.
async fn load(target: &str, capacity: f64, args: &BacklogArgs) -> Vec<(f64, u16, f64)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(args.budget_ms) + PATIENCE)
        .build()
        .expect("a client");
    let began = Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for (rate, secs) in [
        (capacity * 2.0, args.stretch_s),
        (capacity / 2.0, args.normal_s),
    ] {
        let until = Instant::now() + Duration::from_secs(secs);
        let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        while Instant::now() < until {
            every.tick().await;
            let request = client
                .post(target)
                .header("X-Request-Timeout-Ms", args.budget_ms.to_string());
            callers.spawn(async move {
                let sent = Instant::now();
                let status = request.send().await.map_or(0, |r| r.status().as_u16());
                let at = sent.duration_since(began).as_secs_f64();
                (at, status, sent.elapsed().as_secs_f64() * 1000.0)
            });
        }
    }
    callers.join_all().await
}

/// Every 100 ms: the queued jobs and the oldest one's age.
async fn sample(pool: PgPool, began: Instant, into: Arc<Mutex<Vec<(f64, i64, f64)>>>) {
    loop {
        let read: Result<(i64, f64), _> = sqlx::query_as(
            "SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(enqueued_at)), 0)::float8
             FROM queue_jobs WHERE state = 'queued'",
        )
        .fetch_one(&pool)
        .await;
        if let Ok((depth, age)) = read {
            into.lock()
                .unwrap()
                .push((began.elapsed().as_secs_f64(), depth, age));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A row of the table: its name, its figure, the scale it is shown in, its digits.
type Row = (&'static str, fn(&Figures) -> f64, f64, usize);

/// The spread of `figure` over the runs of `mode`.
fn of(runs: &[Run], mode: &str, figure: fn(&Figures) -> f64) -> Option<Spread> {
    let mine = runs.iter().filter(|r| r.mode == mode);
    spread(&mine.map(|r| figure(&r.figures)).collect::<Vec<_>>())
}

/// Propagate's median goodput over legacy's.
fn goodput_ratio(runs: &[Run]) -> f64 {
    let median = |mode| of(runs, mode, |f| f.goodput).map_or(f64::NAN, |s| s.median);
    median("propagate") / median("legacy")
}

/// Median (range) of each figure by mode, and propagate's goodput over legacy's.
fn table(runs: &[Run], args: &BacklogArgs) -> String {
    let cell = |mode, figure, scale: f64, digits| {
        let scaled = |s: Spread| Spread {
            median: s.median * scale,
            min: s.min * scale,
            max: s.max * scale,
        };
        median_range(of(runs, mode, figure).map(scaled), digits)
    };
    let rows: [Row; 5] = [
        (
            "worker time on jobs whose caller had gone (%)",
            |f| f.wasted_share,
            100.0,
            1,
        ),
        ("goodput (shipments within budget/s)", |f| f.goodput, 1.0, 1),
        ("p99 of the answer (ms)", |f| f.p99_ms, 1.0, 0),
        ("oldest queued job's age (s)", |f| f.oldest_s, 1.0, 1),
        ("drain after the stretch (s)", |f| f.drain_s, 1.0, 1),
    ];
    let mut text = format!(
        "backlog: {} workers × {} ms, {} s at 2× then {} s at ½, budget {} ms, {} pairs, commit {}\n\n\
         | figure | legacy | propagate |\n| --- | --- | --- |\n",
        args.workers,
        args.work_ms,
        args.stretch_s,
        args.normal_s,
        args.budget_ms,
        args.pairs,
        commit()
    );
    for (name, figure, scale, digits) in rows {
        let [legacy, propagate] = ["legacy", "propagate"].map(|m| cell(m, figure, scale, digits));
        text += &format!("| {name} | {legacy} | {propagate} |\n");
    }
    text + &format!("\ngoodput propagate / legacy: {:.2}", goodput_ratio(runs))
}
