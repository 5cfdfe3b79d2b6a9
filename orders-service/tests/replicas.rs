//! Replicas for real: two orders-service processes and two catalog-service processes on
//! loopback against one PostgreSQL, as a Kubernetes Deployment of two would run them.
//! Orders replica `i` calls catalog replica `i` (a Service would spread the calls; what
//! matters here is that every hop is a separate process with its own clock and clamp).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{Value, json};
use test_support::process::free_port;
use test_support::{ServiceProcess, metric_value, wait_until};
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Per `Idempotency-Key`: the id of its 201, if any, and whether an attempt got no
/// answer at all (then the client cannot know the outcome).
type Ledger = HashMap<String, (Option<i64>, bool)>;

struct Replicas {
    orders: Vec<(ServiceProcess, String)>,
    catalogs: Vec<(ServiceProcess, String)>,
    side: sqlx::PgPool,
    client: reqwest::Client,
}

async fn start_replicas() -> Replicas {
    let database = test_support::test_database().await;
    // One folder per call: the tests of this file run at once in one process.
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let work = std::env::temp_dir().join(format!("replicas-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let orders_binary = PathBuf::from(env!("CARGO_BIN_EXE_orders-service"));
    let catalog_binary = orders_binary.with_file_name("catalog-service");
    let mut catalogs = Vec::new();
    let mut orders = Vec::new();
    for i in 0..2 {
        // The admin APIs are not used here: any free port, picked by the kernel at bind
        // time. A port picked in advance can be taken by another process before it
        // binds (each such pick is a chance for this test to fail).
        let port = free_port();
        let env = [
            ("CATALOG_LISTEN_ADDR", format!("127.0.0.1:{port}")),
            ("CATALOG_ADMIN_ADDR", "127.0.0.1:0".to_owned()),
        ];
        let log = work.join(format!("catalog-{i}.log"));
        let catalog = ServiceProcess::start(&catalog_binary, &env, log).unwrap();
        let catalog_url = format!("http://127.0.0.1:{port}");
        let port = free_port();
        let env = [
            ("ORDERS_LISTEN_ADDR", format!("127.0.0.1:{port}")),
            ("ORDERS_ADMIN_ADDR", "127.0.0.1:0".to_owned()),
            ("CATALOG_URL", catalog_url.clone()),
            ("DATABASE_URL", database.url.clone()),
        ];
        let log = work.join(format!("orders-{i}.log"));
        orders.push((
            ServiceProcess::start(&orders_binary, &env, log).unwrap(),
            format!("http://127.0.0.1:{port}"),
        ));
        catalogs.push((catalog, catalog_url));
    }
    let client = reqwest::Client::new();
    for (_, url) in &orders {
        wait_until("the replica is ready", Duration::from_secs(30), || async {
            client
                .get(format!("{url}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
    }
    let side = sqlx::PgPool::connect(&database.url).await.unwrap();
    Replicas {
        orders,
        catalogs,
        side,
        client,
    }
}

async fn post(
    client: &reqwest::Client,
    base: &str,
    body: &Value,
    key: &str,
    budget_ms: u64,
) -> Result<(u16, Value), reqwest::Error> {
    let response = client
        .post(format!("{base}/api/orders"))
        .header("X-Request-Timeout-Ms", budget_ms)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}

async fn rows_with_key(side: &sqlx::PgPool, key: &str) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM orders WHERE idempotency_key = $1")
        .bind(key)
        .fetch_all(side)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_across_replicas_make_one_order_and_budgets_shrink_at_every_hop() {
    let r = start_replicas().await;
    // Ten concurrent retries of one key, alternating between the two replicas.
    let body = json!({"sku": "SKU-00077", "quantity": 1});
    let attempts = (0..10).map(|i| post(&r.client, &r.orders[i % 2].1, &body, "across", 2000));
    let mut ids = Vec::new();
    for answer in join_all(attempts).await {
        let (status, order) = answer.unwrap();
        assert_eq!(status, 201, "{order}");
        ids.push(order["id"].as_i64().unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every retry got the first order: {ids:?}");
    assert_eq!(rows_with_key(&r.side, "across").await, ids);

    // Budgets shrink across every hop: what each catalog replica received for the next
    // orders (its own histogram, the system of record of what arrived) is less than the
    // 900 ms the client gave, by at least the per-hop reserve.
    let before = join_all(
        r.catalogs
            .iter()
            .map(|(_, c)| budgets_received(&r.client, c)),
    )
    .await;
    for (i, (_, base)) in r.orders.iter().enumerate() {
        for n in 0..10 {
            let key = format!("shrink-{i}-{n}");
            let (status, _) = post(&r.client, base, &body, &key, 900).await.unwrap();
            assert_eq!(status, 201);
        }
    }
    let after = join_all(
        r.catalogs
            .iter()
            .map(|(_, c)| budgets_received(&r.client, c)),
    )
    .await;
    for (((_, catalog), (count0, sum0)), (count1, sum1)) in r.catalogs.iter().zip(before).zip(after)
    {
        let (count, sum) = (count1 - count0, sum1 - sum0);
        assert_eq!(count, 10.0, "{catalog} received {count} calls");
        let mean = sum / count;
        assert!(
            mean <= 0.895 && mean > 0.8,
            "{catalog}: mean budget received {mean:.3} s, not below the client's 0.9 s"
        );
    }
}

/// `(count, sum)` of the budgets `catalog` accepted so far.
async fn budgets_received(client: &reqwest::Client, catalog: &str) -> (f64, f64) {
    let text = test_support::scrape(client, catalog).await;
    let labels = r#"service="catalog-service""#;
    let count = metric_value(&text, "deadline_inbound_budget_seconds_count", labels).unwrap_or(0.0);
    let sum = metric_value(&text, "deadline_inbound_budget_seconds_sum", labels).unwrap_or(0.0);
    (count, sum)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_one_replica_mid_load_loses_no_confirmed_order() {
    let mut r = start_replicas().await;
    let urls: Vec<String> = r.orders.iter().map(|(_, u)| u.clone()).collect();
    // key -> what the client was told: the id of its 201 (if any), and whether some
    // attempt got no answer at all (its outcome is unknown to the client).
    let told: Arc<Mutex<Ledger>> = Arc::default();
    let until = Instant::now() + MS(3000);
    let clients = (0..8).map(|c| {
        let (client, urls, told) = (r.client.clone(), urls.clone(), told.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let key = format!("load-{c}-{n}");
                let body = json!({"sku": format!("SKU-{:05}", 100 + c), "quantity": 1});
                told.lock().unwrap().insert(key.clone(), (None, false));
                // A refused connection or a 5xx: retry the same key on the other replica.
                for attempt in 0..10 {
                    let base = &urls[(c + n + attempt) % 2];
                    match post(&client, base, &body, &key, 1000).await {
                        Ok((201, order)) => {
                            told.lock().unwrap().get_mut(&key).unwrap().0 = order["id"].as_i64();
                            break;
                        }
                        Ok((status, order)) => {
                            assert!([502, 503, 504].contains(&status), "{status}: {order}");
                        }
                        Err(_) => told.lock().unwrap().get_mut(&key).unwrap().1 = true,
                    }
                }
            }
        })
    });
    let clients: Vec<_> = clients.collect();
    tokio::time::sleep(MS(1000)).await;
    let (mut replica, _) = r.orders.remove(0);
    let stopped = tokio::task::spawn_blocking(move || {
        replica.stop(Duration::from_secs(10));
        replica.exited()
    });
    for client in clients {
        client.await.unwrap();
    }
    let exit = stopped.await.unwrap().expect("the replica exited");
    assert!(exit.success(), "graceful exit after SIGTERM: {exit}");

    let told = told.lock().unwrap().clone();
    let confirmed = told.values().filter(|(id, _)| id.is_some()).count();
    assert!(confirmed > 50, "only {confirmed} orders confirmed");
    for (key, (id, unanswered)) in &told {
        let rows = rows_with_key(&r.side, key).await;
        match id {
            Some(id) => assert_eq!(rows, [*id], "{key}: confirmed {id}, table has {rows:?}"),
            None if !unanswered => {
                assert!(
                    rows.is_empty(),
                    "{key}: only refused, yet written: {rows:?}"
                );
            }
            None => {}
        }
    }
}
