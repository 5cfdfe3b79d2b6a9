//! `cargo xtask cost`: what the server-side limits cost PostgreSQL, measured alone.
//!
//! The `happy` experiment measures the whole machine; this isolates the database's share.
//! pgbench runs the order transaction as each mode sends it, with the service's own SQL
//! ([`PLACE_ORDER`], a copy a test holds to orders-service's, [`begin_sql`],
//! [`commit_sql`]), three round trips each:
//!
//! - legacy: `BEGIN`; the statement; `COMMIT`;
//! - propagate: what the service sends when budgets are alike: the limit a session's first
//!   transaction sent is in force for the next ones, so `BEGIN` alone; the statement;
//!   `COMMIT` (where the schema defers work to COMMIT, the limit re-set before it);
//! - propagate-each: the limit sent by every transaction, as when each budget differs from
//!   the last on its session by more than the limit's tolerance: the bound on the cost.
//!
//! pgbench sends simple queries, the service prepares the statement: both modes pay for
//! parsing and planning here, so the measured cost is, if anything, the smaller. Each run
//! gets a fresh database (bloat would bias the next mode), the order rotates between
//! repeats, and each figure is the ratio of the medians to legacy's, the per-repeat ratios
//! beside it. Results: `summary.json`, `summary.md`, the pgbench scripts and outputs.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context as _;
use deadline_propagation::db::DbConfig;
use deadline_propagation::testing::{DEFERRED_WORK_QUERY, begin_sql, commit_sql, session_options};
use serde::Serialize;
use sqlx::Connection as _;
use test_support::PgCluster;

use crate::stack::{fresh_database, workspace};
use crate::stats::{Spread, spread};

/// `cargo xtask cost`'s command line.
#[derive(Debug, clap::Args)]
pub struct CostArgs {
    /// Runs per mode; the order alternates.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Seconds per pgbench run.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=600))]
    pub seconds: u32,
    /// pgbench clients (sessions), as orders-service's pool would hold.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub clients: u32,
    /// Where to write (default `results/cost`; `docs/results/cost` publishes).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Whether the sessions of both modes carry the bounds the service's sessions carry
    /// (`on`, as the service runs) or none (`off`, as before docs/design.md §5's
    /// bounds for a silent network): they cost the same in both modes, so this moves
    /// both figures, not their ratio.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub session_bounds: String,
}

/// orders-service's `orders::PLACE_ORDER`, copied so that the harness does not build the
/// service (the test `the_statement_is_the_services` keeps the two equal).
pub const PLACE_ORDER: &str = "\
    WITH placed AS ( \
        INSERT INTO orders (sku, quantity, unit_price_cents, total_cents, idempotency_key) \
        VALUES ($1, $2, $3, $4, $5) \
        ON CONFLICT (idempotency_key) DO NOTHING \
        RETURNING id, sku, quantity, unit_price_cents, total_cents, created_at \
    ), taken AS ( \
        UPDATE inventory SET available = available - $2 \
        WHERE sku = $1 AND available >= $2 AND EXISTS (SELECT 1 FROM placed) \
        RETURNING 1 \
    ) \
    SELECT placed.*, EXISTS (SELECT 1 FROM taken) AS stock_taken FROM placed";

/// A new database `name` with orders-service's migrations run, and its connection.
async fn migrated(cluster: &PgCluster, name: &str) -> anyhow::Result<sqlx::PgConnection> {
    let migrations = workspace().join("orders-service/migrations");
    let mut conn = sqlx::PgConnection::connect(&fresh_database(cluster, name).await?).await?;
    sqlx::migrate::Migrator::new(migrations)
        .await?
        .run(&mut conn)
        .await?;
    Ok(conn)
}

/// The limit the batches carry: what a 700 ms budget gives the first statement.
const LIMIT_MS: u64 = 690;

const MODES: [&str; 3] = ["legacy", "propagate", "propagate-each"];

/// One pgbench run.
#[derive(Debug, Serialize)]
struct Run {
    repeat: u32,
    mode: &'static str,
    tps: f64,
}

/// What `summary.json` holds.
#[derive(Debug, Serialize)]
struct Summary {
    commit: String,
    /// The sessions' startup options (`PGOPTIONS`), empty for none.
    session_options: String,
    clients: u32,
    seconds: u32,
    runs: Vec<Run>,
    legacy_tps: Option<Spread>,
    propagate_tps: Option<Spread>,
    /// Median propagate over median legacy.
    ratio: f64,
    /// propagate / legacy within each repeat.
    ratio_per_repeat: Option<Spread>,
    propagate_each_tps: Option<Spread>,
    /// Median propagate-each over median legacy.
    each_ratio: f64,
    /// propagate-each / legacy within each repeat.
    each_ratio_per_repeat: Option<Spread>,
}

/// The pgbench script for `mode`: the service's SQL, pgbench variables for parameters,
/// `\;` where it sends two commands in one query; `deferred`: the schema leaves work to
/// COMMIT (then propagate's COMMIT fires it first under the limit).
pub fn script(mode: &str, deferred: bool) -> String {
    let statement = PLACE_ORDER
        .replace("$1", "('SKU-' || lpad(CAST(:sku AS text), 5, '0'))")
        .replace("$2", "1")
        .replace("$3", "100")
        .replace("$4", "100")
        .replace("$5", "NULL");
    let limit = (mode == "propagate-each").then_some(LIMIT_MS);
    let (begin, commit) = match mode {
        "legacy" => ("BEGIN".to_owned(), "COMMIT".to_owned()),
        _ => (begin_sql(false, limit), commit_sql(deferred, LIMIT_MS)),
    };
    let compound = |sql: String| sql.replace("; ", " \\; ");
    let (begin, commit) = (compound(begin), compound(commit));
    format!("\\set sku random(1, 1000)\n{begin};\n{statement};\n{commit};\n")
}

/// Runs the measurement and writes its results.
pub async fn cost(args: CostArgs) -> anyhow::Result<()> {
    let out = args.out.unwrap_or_else(|| workspace().join("results/cost"));
    std::fs::create_dir_all(out.join("pgbench"))?;
    let commit = crate::stack::commit();
    let options = match args.session_bounds.as_str() {
        "on" => session_options(&DbConfig::default()),
        _ => String::new(),
    };
    let cluster = tokio::task::spawn_blocking(PgCluster::start).await??;
    // What the service learns of the orders schema at start-up decides its COMMIT.
    let mut conn = migrated(&cluster, "cost_schema").await?;
    let deferred: bool = sqlx::query_scalar(DEFERRED_WORK_QUERY)
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    for mode in MODES {
        std::fs::write(out.join(format!("{mode}.sql")), script(mode, deferred))?;
    }
    let mut runs = Vec::new();
    for repeat in 0..args.repeat {
        let mut order = MODES;
        order.rotate_left(repeat as usize % MODES.len());
        for mode in order {
            let database = format!("cost_{repeat}_{}", mode.replace('-', "_"));
            migrated(&cluster, &database).await?.close().await?;
            let output = Command::new(cluster.bin("pgbench"))
                .env("PGOPTIONS", &options)
                .args("-n -M simple -j 2 -h 127.0.0.1 -U postgres".split(' '))
                .args(["-c", &args.clients.to_string()])
                .args(["-T", &args.seconds.to_string()])
                .args(["-p", &cluster.port().to_string(), "-f"])
                .arg(out.join(format!("{mode}.sql")))
                .arg(&database)
                .output()
                .context("cannot run pgbench")?;
            let text = String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr);
            std::fs::write(out.join(format!("pgbench/run-{repeat}-{mode}.txt")), &text)?;
            anyhow::ensure!(output.status.success(), "pgbench failed:\n{text}");
            let tps = parse_tps(&text).with_context(|| format!("no tps in:\n{text}"))?;
            let of = format!("{}/{}", repeat + 1, args.repeat);
            eprintln!("cost run {of}: {mode} {tps:.0} transactions/s");
            runs.push(Run { repeat, mode, tps });
        }
    }
    let tps = |mode: &str| Vec::from_iter(runs.iter().filter(|r| r.mode == mode).map(|r| r.tps));
    let legacy = tps("legacy");
    let legacy_tps = spread(&legacy);
    let against_legacy = |mode: &str| {
        let side = tps(mode);
        let per_repeat: Vec<f64> = legacy.iter().zip(&side).map(|(l, p)| p / l).collect();
        let side = spread(&side);
        let ratio = match (&legacy_tps, &side) {
            (Some(l), Some(p)) => p.median / l.median,
            _ => f64::NAN,
        };
        (side, ratio, spread(&per_repeat))
    };
    let (propagate_tps, ratio, ratio_per_repeat) = against_legacy("propagate");
    let (propagate_each_tps, each_ratio, each_ratio_per_repeat) = against_legacy("propagate-each");
    let summary = Summary {
        commit,
        session_options: options,
        clients: args.clients,
        seconds: args.seconds,
        runs,
        legacy_tps,
        propagate_tps,
        ratio,
        ratio_per_repeat,
        propagate_each_tps,
        each_ratio,
        each_ratio_per_repeat,
    };
    let json = serde_json::to_string_pretty(&summary)? + "\n";
    std::fs::write(out.join("summary.json"), json)?;
    let markdown = markdown(&summary);
    std::fs::write(out.join("summary.md"), &markdown)?;
    println!("{markdown}\nresults in {}", out.display());
    Ok(())
}

fn parse_tps(text: &str) -> Option<f64> {
    let line = text.lines().find_map(|l| l.strip_prefix("tps = "))?;
    line.split_whitespace().next()?.parse().ok()
}

fn markdown(s: &Summary) -> String {
    let cell = |v: &Option<Spread>, digits: usize| match v {
        Some(v) => format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            v.median, v.min, v.max
        ),
        None => "–".to_owned(),
    };
    format!(
        "# The order transaction alone, pgbench\n\nCommit `{}`, {} clients, {} s per run, \
         {} run(s) per mode (median, min–max); sessions' options: `{}`. propagate: the \
         session's limit in force reused (budgets alike); propagate-each: a limit sent by \
         every transaction.\n\n| transactions/s | legacy | propagate | propagate-each |\n\
         | --- | --- | --- | --- |\n| median (min–max) | {} | {} | {} |\n\
         | / legacy | | {:.3} (per repeat: {}) | {:.3} (per repeat: {}) |\n",
        s.commit,
        s.clients,
        s.seconds,
        s.runs.len() / MODES.len(),
        Some(s.session_options.as_str())
            .filter(|o| !o.is_empty())
            .unwrap_or("none"),
        cell(&s.legacy_tps, 0),
        cell(&s.propagate_tps, 0),
        cell(&s.propagate_each_tps, 0),
        s.ratio,
        cell(&s.ratio_per_repeat, 3),
        s.each_ratio,
        cell(&s.each_ratio_per_repeat, 3),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_differ_only_in_the_batches() {
        let legacy = script("legacy", false);
        let (propagate, deferring) = (script("propagate", false), script("propagate", true));
        let each = script("propagate-each", false);
        assert!(legacy.contains("\nBEGIN;\n") && legacy.ends_with("\nCOMMIT;\n"));
        assert_eq!(legacy, script("legacy", true));
        assert_eq!(
            propagate, legacy,
            "a limit in force is reused: no statement"
        );
        assert!(each.contains("\nBEGIN \\; SET statement_timeout = 690;\n"));
        assert!(each.ends_with(";\nCOMMIT;\n"), "{each}");
        assert!(deferring.contains("\nBEGIN;\n"));
        assert!(deferring.ends_with("SET CONSTRAINTS ALL IMMEDIATE \\; COMMIT;\n"));
        for text in [&legacy, &propagate, &each, &deferring] {
            assert!(!text.contains('$'), "a parameter was left: {text}");
            assert!(text.contains("INSERT INTO orders"));
        }
    }

    #[test]
    fn the_statement_is_the_services() {
        assert_eq!(PLACE_ORDER, orders_service::orders::PLACE_ORDER);
    }

    #[test]
    fn reads_pgbench_tps() {
        let out = "latency average = 1.2 ms\ntps = 6543.210987 (without initial connection time)\n";
        assert_eq!(parse_tps(out), Some(6543.210987));
        assert_eq!(parse_tps("nothing"), None);
    }
}
