//! The chaos run: the whole stack as real processes under randomized faults, then the
//! invariants that make "refuse fast, lose nothing" true.
//!
//! Faults: catalog delay, jitter and errors; the catalog killed (SIGKILL) and restarted;
//! PostgreSQL restarted; the catalog pool saturated by bursts; clients that disconnect
//! at random points. Clients retry after 502/503/504 or a lost connection with the same
//! `Idempotency-Key`, as a real client would. `CHAOS_SECONDS` (default 40) sets the
//! length, `CHAOS_SEED` replays a run. The report is printed and written to
//! `target/chaos-report.txt`.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::PgPool;
use test_support::process::free_port;
use test_support::{PgCluster, ServiceProcess, metric_value, wait_until};
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

/// A service binary running as a child process, killed when dropped.
struct Service(ServiceProcess);

impl Service {
    fn start(binary: &Path, env: &[(&str, String)], log: PathBuf) -> Self {
        Self(ServiceProcess::start(binary, env, log).expect("cannot start the service"))
    }

    fn kill(&mut self) {
        self.0.kill();
    }

    fn rss_kib(&self) -> u64 {
        self.0.rss_kib()
    }
}

/// catalog-service's binary, built next to this package's by `cargo test --workspace`.
fn catalog_binary() -> PathBuf {
    let orders = PathBuf::from(env!("CARGO_BIN_EXE_orders-service"));
    let path = orders.with_file_name("catalog-service");
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo test --workspace builds it)",
        path.display()
    );
    path
}

#[derive(Default)]
struct Tally {
    statuses: BTreeMap<String, u64>,
    confirmed: HashMap<String, (i64, String, i64)>,
    gave_up: u64,
    unexpected: Vec<String>,
}

#[derive(Default)]
struct Faults {
    catalog_kills: u64,
    postgres_restarts: u64,
    latency_changes: u64,
    bursts: u64,
    disconnects: AtomicU64,
}

struct Stack {
    orders_url: String,
    catalog_url: String,
    admin_url: String,
    catalog_env: Vec<(&'static str, String)>,
    catalog: Mutex<Service>,
    client: reqwest::Client,
}

impl Stack {
    async fn set_faults(&self, faults: Value) {
        let _ = self
            .client
            .put(format!("{}/admin/faults", self.admin_url))
            .json(&faults)
            .send()
            .await;
    }

    async fn restart_catalog(&self, down_for: Duration) {
        self.catalog.lock().unwrap().kill();
        tokio::time::sleep(down_for).await;
        let log = self.catalog.lock().unwrap().0.log().to_path_buf();
        *self.catalog.lock().unwrap() = Service::start(&catalog_binary(), &self.catalog_env, log);
        let health = format!("{}/healthz", self.catalog_url);
        wait_until("the catalog is back", Duration::from_secs(10), || async {
            self.client
                .get(&health)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
    }

    async fn metrics(&self, url: &str) -> String {
        match self.client.get(format!("{url}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}

/// One logical order: retried with the same key until it is confirmed or we give up.
async fn place_order(
    stack: &Stack,
    rng: &mut StdRng,
    key: String,
    tally: &Mutex<Tally>,
    faults: &Faults,
) {
    let sku = SKUS[rng.random_range(0..SKUS.len())];
    let quantity = rng.random_range(1..=3);
    let body = json!({"sku": sku, "quantity": quantity});
    for _attempt in 0..10 {
        let budget = rng.random_range(100..=900u64);
        let mut request = stack
            .client
            .post(format!("{}/api/orders", stack.orders_url))
            .header("X-Request-Timeout-Ms", budget)
            .header("Idempotency-Key", &key)
            .json(&body);
        // One request in ten disconnects at a random point.
        if rng.random_bool(0.1) {
            request = request.timeout(MS(rng.random_range(1..=400)));
        }
        let outcome = request.send().await;
        let label = match &outcome {
            Ok(r) => r.status().as_u16().to_string(),
            Err(_) => {
                faults.disconnects.fetch_add(1, Ordering::Relaxed);
                "disconnected".to_owned()
            }
        };
        *tally
            .lock()
            .unwrap()
            .statuses
            .entry(label.clone())
            .or_default() += 1;
        match outcome {
            Ok(response) if response.status().as_u16() == 201 => {
                // A 201 counts only with its whole body: a client whose timeout cut the
                // body does not know its order id, so it retries with the same key and
                // gets the first order back.
                if let Ok(order) = response.json::<Value>().await
                    && let Some(id) = order["id"].as_i64()
                {
                    tally
                        .lock()
                        .unwrap()
                        .confirmed
                        .insert(key, (id, sku.to_owned(), quantity));
                    return;
                }
                faults.disconnects.fetch_add(1, Ordering::Relaxed);
            }
            Ok(response) if [502, 503, 504].contains(&response.status().as_u16()) => {}
            Ok(response) => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                tally
                    .lock()
                    .unwrap()
                    .unexpected
                    .push(format!("{status}: {text}"));
                return;
            }
            Err(_) => {}
        }
        tokio::time::sleep(MS(rng.random_range(20..=150))).await;
    }
    tally.lock().unwrap().gave_up += 1;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_loses_nothing_and_leaks_nothing_under_chaos() {
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

    let cluster = Arc::new(
        tokio::task::spawn_blocking(PgCluster::start)
            .await
            .unwrap()
            .unwrap(),
    );
    let database_url = cluster.url("postgres");
    let (catalog_port, admin_port, orders_port) = (free_port(), free_port(), free_port());
    let catalog_env = vec![
        ("CATALOG_LISTEN_ADDR", format!("127.0.0.1:{catalog_port}")),
        ("CATALOG_ADMIN_ADDR", format!("127.0.0.1:{admin_port}")),
    ];
    let catalog = Service::start(&catalog_binary(), &catalog_env, work.join("catalog.log"));
    let orders = Service::start(
        &PathBuf::from(env!("CARGO_BIN_EXE_orders-service")),
        &[
            ("ORDERS_LISTEN_ADDR", format!("127.0.0.1:{orders_port}")),
            ("CATALOG_URL", format!("http://127.0.0.1:{catalog_port}")),
            ("DATABASE_URL", database_url.clone()),
            ("CATALOG_POOL_MAX_CONNECTIONS", "8".into()),
            ("CATALOG_POOL_PENDING_MAX", "8".into()),
            ("DB_POOL_MAX_CONNECTIONS", "8".into()),
        ],
        work.join("orders.log"),
    );
    let stack = Arc::new(Stack {
        orders_url: format!("http://127.0.0.1:{orders_port}"),
        catalog_url: format!("http://127.0.0.1:{catalog_port}"),
        admin_url: format!("http://127.0.0.1:{admin_port}"),
        catalog_env,
        catalog: Mutex::new(catalog),
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap(),
    });
    let ready = format!("{}/readyz", stack.orders_url);
    wait_until(
        "orders-service is ready",
        Duration::from_secs(30),
        || async {
            stack
                .client
                .get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;

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

    let mut faults_log = Vec::new();
    {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut counts = Faults::default();
        // Every kind of fault in each round, in a shuffled order.
        let mut round: Vec<u8> = Vec::new();
        while Instant::now() + Duration::from_secs(3) < until {
            if round.is_empty() {
                round = vec![0, 2, 3, 4];
                round.shuffle(&mut rng);
            }
            match round.pop().unwrap_or(0) {
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
            "totals: {} latency changes, {} catalog kills, {} postgres restarts, {} bursts",
            counts.latency_changes, counts.catalog_kills, counts.postgres_restarts, counts.bursts
        ));
    }
    stack.set_faults(json!({})).await;
    for client in clients {
        client.await.unwrap();
    }

    // Quiescence: gauges must come back by themselves.
    let orders_metrics = stack.orders_url.clone();
    wait_until(
        "orders in-flight, pool and db gauges are back to 0",
        Duration::from_secs(10),
        || async {
            let m = stack.metrics(&orders_metrics).await;
            let v = |name, labels| metric_value(&m, name, labels).unwrap_or(-1.0);
            v("http_server_requests_in_flight", r#"uri="/api/orders""#) == 0.0
                && v("http_client_pool_active_connections", r#"client="catalog""#) == 0.0
                && v("http_client_pool_pending_acquires", r#"client="catalog""#) == 0.0
                && v("db_pool_connections", r#"state="in_use""#) == 0.0
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
            )
            .unwrap_or(0.0)
                == 0.0
        },
    )
    .await;

    let side = PgPool::connect(&database_url).await.unwrap();
    let idle_in_tx: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND pid <> pg_backend_pid()",
    )
    .fetch_one(&side)
    .await
    .unwrap();
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
    let by_key: HashMap<&str, (i64, &str, i32)> = rows
        .iter()
        .filter_map(|(id, sku, q, key)| Some((key.as_deref()?, (*id, sku.as_str(), *q))))
        .collect();
    let lost: Vec<_> = tally
        .confirmed
        .iter()
        .filter(|(key, (id, sku, q))| {
            by_key.get(key.as_str()) != Some(&(*id, sku.as_str(), *q as i32))
        })
        .map(|(key, seen)| {
            format!(
                "{key}: client saw {seen:?}, database has {:?}",
                by_key.get(key.as_str())
            )
        })
        .collect();
    let duplicates = rows.len() - by_key.len();
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

    let report = format!(
        "chaos run: seed {seed}, {seconds} s, {CLIENTS} clients\n\
         faults injected: {}\n  {}\n\
         client disconnects: {}\n\
         requests sent: {sent}; by status: {:?}\n\
         orders confirmed (201): {}; gave up after 10 tries: {}; rows written: {}\n\
         invariant no confirmed order lost: {} ({} lost)\n\
         invariant no duplicate order: {} ({duplicates} duplicates)\n\
         invariant stock = initial - committed, never negative: {} {:?}\n\
         invariant no leaked connection: in-use 0 and idle-in-transaction {idle_in_tx}: {}\n\
         invariant in-flight gauges back to 0: ok\n\
         invariant memory back near start: RSS {} KiB -> {} KiB: {}\n\
         invariant no 500: {} ({five_hundreds}); no panic in logs: {} ({panics}); unexpected answers: {:?}\n",
        faults_log.len() - 1,
        faults_log.join("\n  "),
        faults.disconnects.load(Ordering::Relaxed),
        tally.statuses,
        tally.confirmed.len(),
        tally.gave_up,
        rows.len(),
        ok(lost.is_empty()),
        lost.len(),
        ok(duplicates == 0),
        ok(stock_errors.is_empty()),
        stock_errors,
        ok(idle_in_tx == 0),
        rss_start,
        rss_end,
        ok(rss_end < rss_start + 64 * 1024),
        ok(five_hundreds == 0),
        ok(panics == 0),
        tally.unexpected,
    );
    eprintln!("{report}");
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/chaos-report.txt");
    let _ = std::fs::write(target, &report);

    assert!(lost.is_empty(), "confirmed orders lost: {lost:?}\n{report}");
    assert_eq!(duplicates, 0, "{report}");
    assert!(stock_errors.is_empty(), "{report}");
    assert_eq!(idle_in_tx, 0, "{report}");
    assert!(rss_end < rss_start + 64 * 1024, "{report}");
    assert_eq!(five_hundreds, 0, "{report}");
    assert_eq!(panics, 0, "{report}");
    assert!(tally.unexpected.is_empty(), "{report}");
    assert!(
        tally.confirmed.len() > 50,
        "too few orders went through to mean anything\n{report}"
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
