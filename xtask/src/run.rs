//! One mode of one scenario, start to finish: a fresh database, fresh services, a
//! warm-up, the fault, the load, the drain, the figures. Each step is one function.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use test_support::PgCluster;
use test_support::exposition::Sample as Series;

use crate::k6::{self, K6Run};
use crate::partition::{self, Held};
use crate::sampler::{self, Runtime, Sample, Sampler};
use crate::scenario::{Fault, Load, Side};
use crate::stack::{Ports, ServiceEnv, Services, fresh_database, url};
use crate::stats::{self, Second, unix_ms};

/// What every run of one invocation shares: build `profile`, k6, the `load`, where it
/// writes, the `warm_up` before each load, orders-service's `CATALOG_ADMISSION`.
pub struct Context {
    pub profile: String,
    /// The PostgreSQL server; each run gets a database of its own on it.
    pub cluster: PgCluster,
    /// The services' ports, the same for every run (Prometheus scrapes them).
    pub ports: Ports,
    pub k6: PathBuf,
    pub load: Load,
    /// Allowed lateness of an answer past the budget, for the p99 checks.
    pub margin_ms: u64,
    pub out: PathBuf,
    pub warm_up: Duration,
    pub admission: String,
    /// Record a CPU profile of each service during each load (services built with the
    /// `profiling` feature).
    pub profile_cpu: bool,
}

/// The figures of one run by name (labelled in `summary.rs`): rates per s, times in ms.
pub type Figures = BTreeMap<String, f64>;

/// One side's run (`repeat` 0-based): its figures, gauges and memory four times a
/// second, and arrivals, goodput and p99 per second of arrivals.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModeRun {
    pub mode: String,
    pub repeat: usize,
    pub figures: Figures,
    pub samples: Vec<Sample>,
    pub seconds: Vec<Second>,
    /// For `recovery`: seconds after the load's start when the fault was removed.
    pub fault_removed_at: Option<f64>,
    /// When k6 finished, in Unix seconds (Prometheus is queried just before).
    pub load_ended_at: f64,
    /// For `partition`: when (s into the load) the link was cut and healed, and the
    /// write transactions on the server ten times a second.
    pub partition_at: Option<[f64; 2]>,
    pub held: Vec<Held>,
}

/// Runs `side` once (repeat `repeat`).
pub async fn run_mode(ctx: &Context, side: &Side, repeat: usize) -> anyhow::Result<ModeRun> {
    let mode = side.name;
    let dir = ctx.out.join(format!("run-{repeat}-{mode}"));
    std::fs::create_dir_all(&dir)?;
    let db_name = format!("{}_{repeat}_{mode}", ctx.load.scenario.name()).replace('-', "_");
    let database_url = fresh_database(&ctx.cluster, &db_name).await?;
    let services = start_services(ctx, side, database_url.clone(), &dir).await?;
    if ctx.load.db_statement_ms > 0 {
        // After orders-service's migrations made the table.
        slow_statements(&database_url, ctx.load.db_statement_ms).await?;
    }
    set_fault(&url(ctx.ports.admin), ctx.load.warm_up_fault).await?;
    warm_up(&url(ctx.ports.orders), ctx.load.budget_ms, ctx.warm_up).await;
    // The profiler allocates its table at start and stop, both outside the measured
    // window, so the memory figures see the load alone.
    if ctx.profile_cpu {
        for admin in profiled(&ctx.ports) {
            profile(&admin, "start", None).await?;
        }
    }
    let client = reqwest::Client::new();
    let catalog_before = sampler::scrape(&client, &metrics_url(ctx.ports.catalog)).await;
    let orders_before = sampler::scrape(&client, &metrics_url(ctx.ports.orders)).await;
    // A fault that begins later (`outage`) is injected by the load's own timer.
    let from_start = match ctx.load.fault_from {
        Some(_) => ctx.load.warm_up_fault,
        None => ctx.load.fault,
    };
    set_fault(&url(ctx.ports.admin), from_start).await?;
    let pricing_admin = services
        .pricing
        .as_ref()
        .map(|_| url(ctx.ports.pricing_admin));
    if let Some(admin) = &pricing_admin {
        set_fault(admin, ctx.load.pricing_fault).await?;
    }
    let pricing_before = scrape_pricing(&client, pricing_admin.as_deref()).await;
    let measured = measure_load(ctx, side, &services, &dir, &db_name).await;
    set_fault(&url(ctx.ports.admin), None).await?;
    if let Some(admin) = &pricing_admin {
        set_fault(admin, None).await?;
    }
    let Measured {
        k6: k6_run,
        samples,
        load_start_ms,
        removed_ms,
        cut,
        held,
    } = measured?;
    let load_ended_at = unix_ms() as f64 / 1000.0;
    let (drain, in_flight_end) = wait_drained(&client, ctx.ports.orders).await;
    let catalog_after = sampler::scrape(&client, &metrics_url(ctx.ports.catalog)).await;
    let orders_after = sampler::scrape(&client, &metrics_url(ctx.ports.orders)).await;
    let pricing_after = scrape_pricing(&client, pricing_admin.as_deref()).await;
    let rss_end = test_support::process::rss_kib(services.orders.pid()) as f64 / 1024.0;
    if ctx.profile_cpu {
        for (service, admin) in ["orders", "catalog"].into_iter().zip(profiled(&ctx.ports)) {
            let title = format!(
                "{service}-service, {}, {} scenario: CPU over the load",
                side.name,
                ctx.load.scenario.name()
            );
            let svg = profile(&admin, "stop", Some(&title)).await?;
            std::fs::write(dir.join(format!("flamegraph-{service}.svg")), svg)?;
        }
    }
    services.stop();

    let before = sampler::counters([&orders_before, &catalog_before, &pricing_before]);
    let after = sampler::counters([&orders_after, &catalog_after, &pricing_after]);
    let inputs = FigureInputs {
        load: &ctx.load,
        k6: &k6_run,
        samples: &samples,
        grown: after
            .iter()
            .map(|(name, n)| (name.clone(), n - before[name]))
            .collect(),
        pending_limit: sampler::pending_limit(&orders_before),
        margin_ms: ctx.margin_ms,
        drain,
        in_flight_end,
        rss_end,
        removed_ms,
    };
    let mut figures = figures(&inputs);
    if let (Some(from), Some(until)) = (ctx.load.fault_from, ctx.load.fault_removed_after) {
        // From a second in (the calls sent just before it answer as usual) to the end.
        let window = (from.as_secs_f64() + 1.0, until.as_secs_f64());
        let calls = outage_calls_per_order(&samples, &k6_run.requests, load_start_ms, window);
        figures.extend(calls.map(|calls| ("outage_calls_per_order".to_owned(), calls)));
    }
    let seconds = stats::per_second(&k6_run.requests, load_start_ms, ctx.load.budget_ms);
    let since_start = |ms: u64| ms.saturating_sub(load_start_ms) as f64 / 1000.0;
    let partition_at = cut.map(|(cut, healed)| [since_start(cut), since_start(healed)]);
    if let Some([cut_s, healed_s]) = partition_at {
        figures.extend(partition::figures(&held, &seconds, cut_s, healed_s));
    }
    eprintln!(
        "  {mode:>9}: goodput {:.1}/s, p99 {:.0} ms, 503 {:.1}/s, 504 {:.1}/s, gave up {:.1}/s, k6 exit {}",
        figures["goodput_per_s"],
        figures["p99_ms"],
        figures["refused_per_s"],
        figures["expired_per_s"],
        figures["gave_up_per_s"],
        k6_run.exit_code
    );
    Ok(ModeRun {
        mode: mode.to_owned(),
        repeat,
        figures,
        seconds,
        samples,
        fault_removed_at: removed_ms.map(since_start),
        load_ended_at,
        partition_at,
        held,
    })
}

fn metrics_url(port: u16) -> String {
    format!("{}/metrics", url(port))
}

/// pricing-service's `/metrics` (on its admin port), or nothing without a third hop.
async fn scrape_pricing(client: &reqwest::Client, admin: Option<&str>) -> Vec<Series> {
    match admin {
        Some(admin) => sampler::scrape(client, &format!("{admin}/metrics")).await,
        None => Vec::new(),
    }
}

/// The services of `side` with the scenario's pool size, on a fresh database.
async fn start_services(
    ctx: &Context,
    side: &Side,
    database_url: String,
    dir: &Path,
) -> anyhow::Result<Services> {
    let mut env = ServiceEnv {
        orders: vec![
            ("DEADLINE_MODE".into(), side.mode.into()),
            (
                "CATALOG_POOL_MAX_CONNECTIONS".into(),
                ctx.load.pool_max_connections.to_string(),
            ),
            ("CATALOG_ADMISSION".into(), ctx.admission.clone()),
            ("LOG_FORMAT".into(), "text".into()),
            ("RUST_LOG".into(), "warn".into()),
        ],
        catalog: vec![("RUST_LOG".into(), "warn".into())],
        pricing: ctx.load.pricing_fault.is_some(),
        shipping: vec![("RUST_LOG".into(), "warn".into())],
    };
    if ctx.load.hedging {
        env.orders.push(("CATALOG_HEDGE".into(), "on".into()));
    }
    for (key, value) in side.env {
        env.orders.push(((*key).into(), (*value).into()));
        env.catalog.push(((*key).into(), (*value).into()));
    }
    Services::start(&ctx.profile, ctx.ports, database_url, &env, dir).await
}

/// Makes every stock update hold its row lock `ms` on the server (a trigger sleeps).
async fn slow_statements(database_url: &str, ms: u64) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(database_url).await?;
    let seconds = ms as f64 / 1000.0;
    // The number is ours, formatted in; a simple query takes no parameters.
    let sql = format!(
        "CREATE FUNCTION experiment_slow_stock() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep({seconds}); RETURN NEW; END $$; \
         CREATE TRIGGER experiment_slow_stock BEFORE UPDATE ON inventory FOR EACH ROW \
         EXECUTE FUNCTION experiment_slow_stock()"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

/// Orders with no fault for `length`, 8 at a time: connections, pools, caches and a
/// cold debug build settle before anything is measured.
async fn warm_up(orders_url: &str, budget_ms: u64, length: Duration) {
    let client = reqwest::Client::new();
    let until = Instant::now() + length;
    let workers = (0..8).map(|w| {
        let (client, url) = (client.clone(), format!("{orders_url}/api/orders"));
        tokio::spawn(async move {
            let mut n = 0u32;
            while Instant::now() < until {
                n += 1;
                let body = serde_json::json!({"sku": format!("SKU-{:05}", 1 + (w * 97 + n) % 1000), "quantity": 1});
                let _ = client
                    .post(&url)
                    .header("X-Request-Timeout-Ms", budget_ms.to_string())
                    .json(&body)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
            }
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        let _ = worker.await;
    }
    // One assistant turn, so the tool-call series (and their dashboard panel) have data.
    let _ = client
        .post(format!("{orders_url}/api/assistant/chat"))
        .json(&serde_json::json!({"message": "What does SKU-00001 cost?"}))
        .send()
        .await;
}

/// `PUT /admin/faults` with `fault`, or `DELETE` when `None`.
pub async fn set_fault(admin_url: &str, fault: Option<Fault>) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let url = format!("{admin_url}/admin/faults");
    let request = match fault {
        Some(f) => client.put(&url).json(&serde_json::json!({
            "delay_ms": f.delay_ms, "jitter_ms": f.jitter_ms, "error_rate": 0.0,
            "busy_ms": f.busy_ms, "straggler_rate": f.straggler_rate,
            "straggler_ms": f.straggler_ms, "unavailable_rate": f.unavailable_rate
        })),
        None => client.delete(&url),
    };
    let response = request
        .send()
        .await
        .context("catalog admin API unreachable")?;
    anyhow::ensure!(
        response.status().is_success(),
        "{url} answered {}",
        response.status()
    );
    Ok(())
}

/// What one load left; when the fault was removed and the link cut and healed, if so.
struct Measured {
    k6: K6Run,
    samples: Vec<Sample>,
    load_start_ms: u64,
    removed_ms: Option<u64>,
    cut: Option<(u64, u64)>,
    held: Vec<Held>,
}

/// k6 with the sampler beside it, and the load's timed fault or cut.
async fn measure_load(
    ctx: &Context,
    side: &Side,
    services: &Services,
    dir: &Path,
    db_name: &str,
) -> anyhow::Result<Measured> {
    let watched = match ctx.load.partition {
        Some(partition) => Some((
            partition::Observer::start(&ctx.cluster.socket_url(db_name)).await?,
            partition::Cut::start(ctx.cluster.port(), partition).await?,
        )),
        None => None,
    };
    let sampler = Sampler::start(
        metrics_url(ctx.ports.orders),
        metrics_url(ctx.ports.catalog),
        services.orders.pid(),
    );
    let load_start_ms = unix_ms();
    let injector = ctx.load.fault_from.map(|from| {
        let (admin, fault) = (url(ctx.ports.admin), ctx.load.fault);
        tokio::spawn(async move {
            tokio::time::sleep(from).await;
            set_fault(&admin, fault).await
        })
    });
    let remover = ctx.load.fault_removed_after.map(|after| {
        let admin = url(ctx.ports.admin);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            set_fault(&admin, None).await.map(|()| unix_ms())
        })
    });
    let k6_run = k6::run(
        &ctx.k6,
        &ctx.load,
        side.mode,
        &url(ctx.ports.orders),
        ctx.margin_ms,
        dir,
    )
    .await;
    let samples = sampler.stop().await;
    if let Some(task) = injector {
        task.await??;
    }
    let removed_ms = match remover {
        Some(task) => Some(task.await??),
        None => None,
    };
    let (cut, held) = match watched {
        Some((observer, cut)) => (Some(cut.finish().await?), observer.stop().await),
        None => (None, Vec::new()),
    };
    Ok(Measured {
        k6: k6_run?,
        samples,
        load_start_ms,
        removed_ms,
        cut,
        held,
    })
}

/// The admin URLs of the services a `--profile-cpu` run records: orders, catalog.
fn profiled(ports: &Ports) -> [String; 2] {
    [url(ports.orders_admin), url(ports.admin)]
}

/// `POST {admin}/admin/profile/{action}` (`start` or `stop`, with a title): the
/// recorder of a service built with `profiling`; `stop` answers the flamegraph.
async fn profile(admin: &str, action: &str, title: Option<&str>) -> anyhow::Result<Vec<u8>> {
    let base = format!("{admin}/admin/profile/{action}");
    let url = match title {
        Some(title) => reqwest::Url::parse_with_params(&base, [("title", title)])?,
        None => reqwest::Url::parse(&base)?,
    };
    let response = reqwest::Client::new()
        .post(url.clone())
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .with_context(|| format!("{url} unreachable"))?;
    let status = response.status();
    let body = response.bytes().await?;
    anyhow::ensure!(
        status.is_success(),
        "{url} answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(body.to_vec())
}

/// Waits (at most 30 s) until no order is in flight: how long, and the last count read.
async fn wait_drained(client: &reqwest::Client, orders: u16) -> (Duration, Option<f64>) {
    let started = Instant::now();
    let mut in_flight = None;
    while started.elapsed() < Duration::from_secs(30) {
        let series = sampler::scrape(client, &metrics_url(orders)).await;
        in_flight = sampler::orders_in_flight(&series).or(in_flight);
        if in_flight == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (started.elapsed(), in_flight)
}

/// Calls the catalog received per order sent in `window` (s into the load), between the
/// samples nearest the window's ends.
pub fn outage_calls_per_order(
    samples: &[Sample],
    requests: &[stats::Request],
    load_start_ms: u64,
    window: (f64, f64),
) -> Option<f64> {
    let first = samples.iter().find(|s| s.t >= window.0)?;
    let last = samples.iter().rev().find(|s| s.t <= window.1)?;
    let (from_ms, until_ms) = (
        load_start_ms + (first.t * 1000.0) as u64,
        load_start_ms + (last.t * 1000.0) as u64,
    );
    let orders = requests
        .iter()
        .filter(|r| r.arrival_ms >= from_ms && r.arrival_ms < until_ms)
        .count();
    (orders > 0 && last.t > first.t)
        .then(|| (last.catalog_received - first.catalog_received) / orders as f64)
}

/// The share of `hop`'s answers later than its deadline + [`sampler::HOP_LATE_AFTER`].
fn late_share(grown: &BTreeMap<String, f64>, hop: &str) -> Option<f64> {
    let answers = grown[&format!("{hop}_answers")];
    (answers > 0.0).then(|| grown[&format!("{hop}_late")] / answers)
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / f64::from(n) }
}

/// The mean catalog call (ms) between the first and the last sample, if one ended.
pub fn call_mean_ms(samples: &[Sample]) -> Option<f64> {
    let (first, last) = (samples.first()?, samples.last()?);
    let calls = last.catalog_calls - first.catalog_calls;
    (calls > 0.0).then(|| (last.catalog_call_s - first.catalog_call_s) / calls * 1000.0)
}

/// The share of a runtime's worker time spent busy between its first and last reading
/// (`None` without two apart in time). Workers add busy time in steps (when they park,
/// every few dozen polls), so a short window can read a little above 1.
pub fn busy_ratio(samples: &[Sample], runtime: fn(&Sample) -> Option<Runtime>) -> Option<f64> {
    let reading = |s: &Sample| runtime(s).map(|r| (s.t, r));
    let (t0, first) = samples.iter().find_map(reading)?;
    let (t1, last) = samples.iter().rev().find_map(reading)?;
    let worker_seconds = (t1 - t0) * last.workers;
    (worker_seconds > 0.0).then(|| (last.busy_s - first.busy_s) / worker_seconds)
}

/// The largest `value` of a runtime's readings; `None` without any.
fn runtime_peak(
    samples: &[Sample],
    runtime: fn(&Sample) -> Option<Runtime>,
    value: fn(&Runtime) -> f64,
) -> Option<f64> {
    samples
        .iter()
        .filter_map(runtime)
        .map(|r| value(&r))
        .reduce(f64::max)
}

/// What [`figures`] computes from: the load that ran, k6's exit code and request log,
/// the sampler's samples, how long the drain took and the memory after it (MiB).
pub struct FigureInputs<'a> {
    pub load: &'a Load,
    pub k6: &'a K6Run,
    pub samples: &'a [Sample],
    /// What the services' [`sampler::counters`] grew by during the load and its drain.
    pub grown: BTreeMap<String, f64>,
    /// The catalog bulkhead's queue limit, if it could be read.
    pub pending_limit: Option<f64>,
    /// How late past the budget an answer may be and still count as in time.
    pub margin_ms: u64,
    pub drain: Duration,
    /// In-flight orders when the drain ended, if they could be read.
    pub in_flight_end: Option<f64>,
    pub rss_end: f64,
    /// When the fault was removed (recovery), ms since the epoch.
    pub removed_ms: Option<u64>,
}

/// The figures of one run.
pub fn figures(input: &FigureInputs<'_>) -> Figures {
    let (requests, samples, grown) = (&input.k6.requests, input.samples, &input.grown);
    let (secs, budget_ms) = (input.load.duration.as_secs_f64(), input.load.budget_ms);
    let count =
        |keep: &dyn Fn(&stats::Request) -> bool| requests.iter().filter(|r| keep(r)).count() as f64;
    let per_s = |status: u16| count(&|r| r.status == status) / secs;
    let orders = requests.len() as f64;
    let per_order = |n: f64| if orders > 0.0 { n / orders } else { 0.0 };
    let latencies: Vec<f64> = requests.iter().map(|r| r.elapsed_ms as f64).collect();
    let quantile = |q| stats::quantile(&latencies, q).unwrap_or(0.0);
    let peak = |f: fn(&Sample) -> f64| samples.iter().map(f).fold(0.0, f64::max);
    let catalog_busy = mean(samples.iter().map(|s| s.catalog_in_flight));
    #[rustfmt::skip]
    let always = [
        ("goodput_per_s", stats::goodput(requests, budget_ms, secs)),
        ("sent_per_s", requests.len() as f64 / secs),
        ("created_per_s", per_s(201)),
        ("refused_per_s", per_s(503)),
        ("expired_per_s", per_s(504)),
        ("gave_up_per_s", per_s(0)),
        // What the p99 check looks at: the client waits a second past the budget, so a
        // late answer shows as late instead of being cut at the budget.
        ("late_per_s", count(&|r| r.status == 0 || r.elapsed_ms > budget_ms + input.margin_ms) / secs),
        // A bug or a transport error, in total.
        ("other", count(&|r| ![0, 201, 503, 504].contains(&r.status))),
        ("p50_ms", quantile(0.5)),
        ("p99_ms", quantile(0.99)),
        ("p999_ms", quantile(0.999)),
        ("max_ms", latencies.iter().copied().fold(0.0, f64::max)),
        ("in_time_share", per_order(count(&|r| r.good(budget_ms)))),
        // First attempts, hedges and retries, the ones dropped unfinished too.
        ("attempts_per_order", per_order(grown["attempts"])),
        ("attempts_cut_per_s", grown["attempts_cut"] / secs),
        ("hedges_per_s", grown["hedges"] / secs),
        ("extra_attempts_cut_per_s", grown["extra_cut"] / secs),
        ("extra_refused_deadline_per_s", grown["extra_refused_deadline"] / secs),
        ("catalog_calls_per_s", grown["catalog_calls"] / secs),
        ("predicted_late_per_s", grown["predicted_late"] / secs),
        ("catalog_busy_slots", catalog_busy),
        // Busy with calls that produced no answer: for callers that had gone.
        ("catalog_wasted_slots", (catalog_busy - grown["catalog_answer_seconds"] / secs).max(0.0)),
        ("pending_peak", peak(|s| s.pending)),
        ("pending_mean", mean(samples.iter().map(|s| s.pending))),
        ("active_peak", peak(|s| s.active)),
        ("in_flight_peak", peak(|s| s.in_flight)),
        ("rss_start_mib", samples.first().map_or(0.0, |s| s.rss_mib)),
        ("rss_peak_mib", peak(|s| s.rss_mib)),
        ("rss_end_mib", input.rss_end),
        ("drain_ms", input.drain.as_secs_f64() * 1000.0),
        ("k6_exit", f64::from(input.k6.exit_code)),
    ];
    let orders = |s: &Sample| s.orders_runtime;
    let catalog = |s: &Sample| s.catalog_runtime;
    let recovery = |removed| stats::recovery_ms(requests, removed, budget_ms, 0.95);
    // Left out where they could not be read.
    #[rustfmt::skip]
    let known = [
        ("catalog_call_mean_ms", call_mean_ms(samples)),
        ("orders_busy_ratio", busy_ratio(samples, orders)),
        ("catalog_busy_ratio", busy_ratio(samples, catalog)),
        ("orders_global_queue_peak", runtime_peak(samples, orders, |r| r.global_queue)),
        ("catalog_global_queue_peak", runtime_peak(samples, catalog, |r| r.global_queue)),
        ("orders_alive_tasks_peak", runtime_peak(samples, orders, |r| r.alive_tasks)),
        ("pending_limit", input.pending_limit),
        ("in_flight_end", input.in_flight_end),
        ("recovery_ms", input.removed_ms.and_then(recovery).map(|ms| ms as f64)),
        ("catalog_calls_per_order", Some(per_order(grown["catalog_received"]))),
        ("pricing_calls_per_order", (grown["pricing_received"] > 0.0).then(|| per_order(grown["pricing_received"]))),
        ("orders_late_share", late_share(grown, "orders")),
        ("catalog_late_share", late_share(grown, "catalog")),
        ("pricing_late_share", late_share(grown, "pricing")),
    ];
    let known = known
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)));
    always
        .into_iter()
        .chain(known)
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, busy_s: Option<f64>, calls: f64, call_s: f64) -> Sample {
        Sample {
            t,
            catalog_calls: calls,
            catalog_call_s: call_s,
            catalog_runtime: busy_s.map(|busy_s| Runtime {
                workers: 2.0,
                busy_s,
                ..Runtime::default()
            }),
            ..Sample::default()
        }
    }

    #[test]
    fn the_busy_ratio_is_busy_time_over_worker_time_between_readings() {
        // 2 workers for 10 s, 15 s busy between the first and the last reading; the
        // samples without a reading (a failed scrape) are skipped, not read as 0.
        let samples = [
            sample(0.0, None, 0.0, 0.0),
            sample(1.0, Some(4.0), 0.0, 0.0),
            sample(6.0, None, 0.0, 0.0),
            sample(11.0, Some(19.0), 0.0, 0.0),
            sample(11.25, None, 0.0, 0.0),
        ];
        assert_eq!(busy_ratio(&samples, |s| s.catalog_runtime), Some(0.75));
        assert_eq!(busy_ratio(&samples, |s| s.orders_runtime), None);
        assert_eq!(busy_ratio(&samples[1..2], |s| s.catalog_runtime), None);
    }

    #[test]
    fn the_call_mean_is_of_the_calls_that_ended_in_the_window() {
        // 50 calls and 25 s of call time before the load; 100 calls and 10 s during it.
        let samples = [
            sample(0.0, None, 50.0, 25.0),
            sample(20.0, None, 150.0, 35.0),
        ];
        assert_eq!(call_mean_ms(&samples), Some(100.0));
        assert_eq!(call_mean_ms(&samples[..1]), None, "no call ended");
        assert_eq!(call_mean_ms(&[]), None);
    }
}
