//! The chaos run: the whole stack as real processes under randomized faults, then the
//! invariants that make "refuse fast, lose nothing" true.
//!
//! Faults: catalog delay, jitter and errors; the catalog killed (SIGKILL) and restarted;
//! PostgreSQL restarted; the link to PostgreSQL and the link to the catalog each cut
//! (every packet dropped both ways, no reset) for a random time and healed; the catalog
//! pool saturated by bursts; clients that disconnect at random points. Clients retry after 502/503/504 or a lost connection with the same
//! `Idempotency-Key`, as a real client would. `CHAOS_SECONDS` (default 40) sets the
//! length, `CHAOS_SEED` replays a run. The report is printed and written to
//! `target/chaos-report.txt`.

#[path = "chaos/ledger.rs"]
mod ledger;
#[path = "chaos/stack.rs"]
mod stack;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ledger::{Tally, hold_against_the_table, place_order};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use stack::Stack;
use test_support::net::Link;
use test_support::{PgCluster, metric_value, wait_until};
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;
const SKUS: [&str; 8] = [
    "SKU-00501",
    "SKU-00502",
    "SKU-00503",
    "SKU-00504",
    "SKU-00505",
    "SKU-00506",
    "SKU-00507",
    "SKU-00508",
];
const CLIENTS: usize = 12;

#[derive(Default)]
pub(crate) struct Faults {
    catalog_kills: u64,
    postgres_restarts: u64,
    latency_changes: u64,
    bursts: u64,
    postgres_partitions: u64,
    catalog_partitions: u64,
    pub(crate) disconnects: AtomicU64,
}

/// The two links the run cuts: orders-service to PostgreSQL, and to the catalog.
struct Links {
    postgres: Link,
    catalog: Link,
}

/// Injects every kind of fault, in shuffled rounds, until `until`; returns the log of
/// what was injected and how often each kind fired.
async fn inject_faults(
    stack: &Arc<Stack>,
    cluster: &Arc<PgCluster>,
    links: &Links,
    tally: &Arc<Mutex<Tally>>,
    seed: u64,
    until: Instant,
) -> (Vec<String>, Faults) {
    let mut faults_log = Vec::new();
    let mut counts = Faults::default();
    let mut rng = StdRng::seed_from_u64(seed);
    // Every kind of fault in each round, in a shuffled order.
    let mut round: Vec<u8> = Vec::new();
    while Instant::now() + Duration::from_secs(3) < until {
        if round.is_empty() {
            round = vec![0, 2, 3, 4, 5, 6];
            round.shuffle(&mut rng);
        }
        let kind = round.pop().unwrap_or(0);
        match kind {
            0 | 1 => {
                let config = json!({
                    "delay_ms": rng.random_range(0..=1200),
                    "jitter_ms": rng.random_range(0..=300),
                    "error_rate": rng.random_range(0.0..0.3),
                });
                faults_log.push(format!("latency {config}"));
                stack.set_faults(config).await;
                counts.latency_changes += 1;
            }
            2 => {
                faults_log.push("catalog killed".to_owned());
                stack
                    .restart_catalog(MS(rng.random_range(300..=1500)))
                    .await;
                counts.catalog_kills += 1;
            }
            3 => {
                faults_log.push("postgres restarted".to_owned());
                let c = cluster.clone();
                tokio::task::spawn_blocking(move || c.stop())
                    .await
                    .unwrap()
                    .unwrap();
                tokio::time::sleep(MS(rng.random_range(300..=1500))).await;
                let c = cluster.clone();
                tokio::task::spawn_blocking(move || c.resume())
                    .await
                    .unwrap()
                    .unwrap();
                counts.postgres_restarts += 1;
            }
            5 | 6 => {
                let (link, name) = if kind == 5 {
                    counts.postgres_partitions += 1;
                    (&links.postgres, "postgres")
                } else {
                    counts.catalog_partitions += 1;
                    (&links.catalog, "catalog")
                };
                let cut_for = MS(rng.random_range(300..=3000));
                faults_log.push(format!("link to {name} cut for {} ms", cut_for.as_millis()));
                link.partition();
                tokio::time::sleep(cut_for).await;
                link.heal();
            }
            _ => {
                faults_log.push("burst of 40 against a slow catalog".to_owned());
                stack.set_faults(json!({"delay_ms": 800})).await;
                let burst: Vec<_> = (0..40)
                    .map(|_| {
                        let stack = stack.clone();
                        tokio::spawn(async move {
                            stack
                                .client
                                .get(format!("{}/api/orders/1", stack.orders_url))
                                .send()
                                .await
                                .ok();
                            stack
                                .client
                                .post(format!("{}/api/orders", stack.orders_url))
                                .header("X-Request-Timeout-Ms", "700")
                                .json(&json!({"sku": "SKU-00999", "quantity": 1}))
                                .send()
                                .await
                                .map(|r| r.status().as_u16())
                                .ok()
                        })
                    })
                    .collect();
                for b in burst {
                    if let Ok(Some(status)) = b.await {
                        *tally
                            .lock()
                            .unwrap()
                            .statuses
                            .entry(format!("burst {status}"))
                            .or_default() += 1;
                    }
                }
                counts.bursts += 1;
            }
        }
        tokio::time::sleep(MS(rng.random_range(1000..=2500))).await;
    }
    faults_log.push(format!(
        "totals: {} latency changes, {} catalog kills, {} postgres restarts, {} bursts, \
         {} postgres partitions, {} catalog partitions",
        counts.latency_changes,
        counts.catalog_kills,
        counts.postgres_restarts,
        counts.bursts,
        counts.postgres_partitions,
        counts.catalog_partitions
    ));
    (faults_log, counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_loses_nothing_and_leaks_nothing_under_chaos() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let seconds: u64 = std::env::var("CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
    let work = std::env::temp_dir().join(format!("chaos-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();

    let (stack, orders, cluster) = Stack::start(&work).await;
    let stack = Arc::new(stack);
    let cluster = Arc::new(cluster);
    let database_url = cluster.url("postgres");

    let side = PgPool::connect(&database_url).await.unwrap();
    let initial = stock_of(&side).await;
    side.close().await;

    // Warm up, then take the memory baseline.
    for _ in 0..20 {
        let _ = stack
            .client
            .post(format!("{}/api/orders", stack.orders_url))
            .json(&json!({"sku": "SKU-00001", "quantity": 1}))
            .send()
            .await;
    }
    let rss_start = orders.rss_kib();

    let tally = Arc::new(Mutex::new(Tally::default()));
    let faults = Arc::new(Faults::default());
    let until = Instant::now() + Duration::from_secs(seconds);
    let next_key = Arc::new(AtomicU64::new(0));

    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (stack, tally, faults, next_key) = (
                stack.clone(),
                tally.clone(),
                faults.clone(),
                next_key.clone(),
            );
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (i as u64 + 1));
                while Instant::now() < until {
                    let key = format!("chaos-{seed}-{}", next_key.fetch_add(1, Ordering::Relaxed));
                    place_order(&stack, &mut rng, key, &tally, &faults).await;
                }
            })
        })
        .collect();

    let links = Links {
        postgres: Link::to(cluster.port()),
        catalog: Link::to(stack.catalog_port()),
    };
    let (faults_log, counts) = inject_faults(&stack, &cluster, &links, &tally, seed, until).await;
    drop(links);
    stack.set_faults(json!({})).await;
    for client in clients {
        client.await.unwrap();
    }

    // Quiescence. The metrics must say so by themselves (a missing sample fails)...
    let orders_metrics = stack.orders_url.clone();
    wait_until(
        "orders in-flight and pool gauges are back to 0",
        Duration::from_secs(10),
        || async {
            let m = stack.metrics(&orders_metrics).await;
            let v = |name, labels| metric_value(&m, name, labels).unwrap_or(-1.0);
            v("http_server_requests_in_flight", r#"uri="/api/orders""#) == 0.0
                && v("http_client_pool_active_connections", r#"client="catalog""#) == 0.0
                && v("http_client_pool_pending_acquires", r#"client="catalog""#) == 0.0
                && v("db_pool_pending_acquires", "") == 0.0
        },
    )
    .await;
    let catalog_metrics = stack.catalog_url.clone();
    wait_until(
        "catalog in-flight is back to 0",
        Duration::from_secs(10),
        || async {
            let m = stack.metrics(&catalog_metrics).await;
            metric_value(
                &m,
                "http_server_requests_in_flight",
                r#"uri="/catalog/{sku}""#,
            ) == Some(0.0)
        },
    )
    .await;
    // ...and so must the database, the system of record, while orders-service still runs:
    // none of its sessions runs a statement or holds a transaction open.
    let side = PgPool::connect_with(
        database_url
            .parse::<PgConnectOptions>()
            .unwrap()
            .application_name("chaos-side"),
    )
    .await
    .unwrap();
    let busy_sessions = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' \
             AND application_name <> 'chaos-side' AND state <> 'idle'",
        )
        .fetch_one(&side)
        .await
        .unwrap()
    };
    let settled = tokio::time::timeout(Duration::from_secs(5), async {
        while busy_sessions().await != 0 {
            tokio::time::sleep(MS(10)).await;
        }
    })
    .await
    .is_ok();
    let busy = busy_sessions().await;
    let rows: Vec<(i64, String, i32, Option<String>)> =
        sqlx::query_as("SELECT id, sku, quantity, idempotency_key FROM orders WHERE idempotency_key LIKE 'chaos-%'")
            .fetch_all(&side)
            .await
            .unwrap();
    let stock = stock_of(&side).await;
    let rss_end = orders.rss_kib();
    let panics = std::fs::read_to_string(work.join("orders.log"))
        .unwrap_or_default()
        .matches("panicked")
        .count()
        + std::fs::read_to_string(work.join("catalog.log"))
            .unwrap_or_default()
            .matches("panicked")
            .count();

    let tally = tally.lock().unwrap();
    let verdict = hold_against_the_table(&tally, &rows);
    let mut stock_errors = Vec::new();
    for sku in SKUS {
        let committed: i64 = rows
            .iter()
            .filter(|r| r.1 == sku)
            .map(|r| i64::from(r.2))
            .sum();
        let (before, after) = (initial[sku], stock[sku]);
        if after != before - committed || after < 0 {
            stock_errors.push(format!("{sku}: {before} - {committed} != {after}"));
        }
    }
    let five_hundreds: u64 = tally
        .statuses
        .iter()
        .filter(|(k, _)| k.ends_with("500"))
        .map(|(_, v)| v)
        .sum();
    let sent: u64 = tally.statuses.values().sum();
    let disconnects = faults.disconnects.load(Ordering::Relaxed);
    let every_fault_fired = counts.latency_changes > 0
        && counts.catalog_kills > 0
        && counts.postgres_restarts > 0
        && counts.bursts > 0
        && counts.postgres_partitions > 0
        && counts.catalog_partitions > 0
        && disconnects > 0;
    // Freed memory may stay with the allocator; a leak per request would grow by far more
    // than this over thousands of requests.
    let rss_bound = rss_start + 16 * 1024;

    let report = format!(
        "chaos run: seed {seed}, {seconds} s, {CLIENTS} clients\n\
         faults injected: {}\n  {}\n\
         client disconnects: {disconnects}\n\
         requests sent: {sent}; by status: {:?}\n\
         orders: {} keys; confirmed (201): {}; only refused (502/503/504): {}; \
         some answer lost: {} ({} of them written); rows written: {}\n\
         invariant every fault kind fired: {}\n\
         invariant no confirmed order lost, every 201 of a key the same order: {} {:?}\n\
         invariant a key told only 502/503/504 wrote nothing: {} {:?}\n\
         invariant no row without a client that asked for it: {} {:?}\n\
         invariant stock = initial - committed, never negative: {} {:?}\n\
         invariant no session of orders-service busy or idle in transaction (pg_stat_activity): {} ({busy})\n\
         invariant in-flight and pool gauges back to 0: ok\n\
         invariant memory back near start: RSS {} KiB -> {} KiB (bound {} KiB): {}\n\
         invariant no 500 but outcome-unknown: {} ({five_hundreds}); no panic in logs: {} ({panics}); unexpected answers: {:?}\n",
        faults_log.len() - 1,
        faults_log.join("\n  "),
        tally.statuses,
        tally.keys.len(),
        verdict.confirmed,
        verdict.refused_only,
        verdict.unanswered,
        verdict.unanswered_written,
        rows.len(),
        ok(every_fault_fired),
        ok(verdict.lost.is_empty()),
        verdict.lost,
        ok(verdict.refused_but_written.is_empty()),
        verdict.refused_but_written,
        ok(verdict.unknown_rows.is_empty()),
        verdict.unknown_rows,
        ok(stock_errors.is_empty()),
        stock_errors,
        ok(settled && busy == 0),
        rss_start,
        rss_end,
        rss_bound,
        ok(rss_end < rss_bound),
        ok(five_hundreds == 0),
        ok(panics == 0),
        tally.unexpected,
    );
    eprintln!("{report}");
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/chaos-report.txt");
    let _ = std::fs::write(target, &report);

    assert!(every_fault_fired, "{report}");
    assert!(verdict.lost.is_empty(), "{report}");
    assert!(verdict.refused_but_written.is_empty(), "{report}");
    assert!(verdict.unknown_rows.is_empty(), "{report}");
    assert!(stock_errors.is_empty(), "{report}");
    assert!(settled && busy == 0, "{report}");
    assert!(rss_end < rss_bound, "{report}");
    assert_eq!(five_hundreds, 0, "{report}");
    assert_eq!(panics, 0, "{report}");
    assert!(tally.unexpected.is_empty(), "{report}");
    assert!(
        verdict.confirmed > 50 && verdict.refused_only > 0,
        "too few orders went through, or none was refused, to mean anything\n{report}"
    );
    drop(orders);
    let _ = std::fs::remove_dir_all(&work);
}

/// Stock of the SKUs the clients order.
async fn stock_of(pool: &PgPool) -> HashMap<String, i64> {
    sqlx::query_as::<_, (String, i32)>("SELECT sku, available FROM inventory WHERE sku = ANY($1)")
        .bind(SKUS.map(str::to_owned).to_vec())
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .map(|(sku, n)| (sku, i64::from(n)))
        .collect()
}

fn ok(holds: bool) -> &'static str {
    if holds { "ok" } else { "VIOLATED" }
}
