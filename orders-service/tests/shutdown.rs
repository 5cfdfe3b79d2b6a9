//! Graceful shutdown under load: SIGTERM to the real binary while orders are in flight.

use std::process::{Command, Stdio};
use std::time::Duration;

use catalog_service::{Application as Catalog, Config as CatalogConfig, FaultConfig};
use serde_json::json;
use test_support::{metric_value, wait_until};
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;
const MAX_BUDGET_MS: u64 = 1500;

#[tokio::test]
async fn sigterm_lets_in_flight_orders_finish_within_their_budget_and_exits_in_time() {
    let database = test_support::test_database().await;
    let catalog = Catalog::build(CatalogConfig::for_tests()).await.unwrap();
    let catalog_url = format!("http://127.0.0.1:{}", catalog.port());
    catalog.faults().set(FaultConfig {
        delay_ms: 400,
        ..FaultConfig::default()
    });
    let _catalog = test_support::spawn(|shutdown| catalog.run_until(shutdown));

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let mut orders = Command::new(env!("CARGO_BIN_EXE_orders-service"))
        .env("ORDERS_LISTEN_ADDR", format!("127.0.0.1:{port}"))
        // Any free port: the default (9080) may be held by another orders-service on
        // this machine, and then this one could not start.
        .env("ORDERS_ADMIN_ADDR", "127.0.0.1:0")
        .env("CATALOG_URL", &catalog_url)
        .env("DATABASE_URL", &database.url)
        .env("DEADLINE_MAX_MS", MAX_BUDGET_MS.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    wait_until(
        "orders-service is ready",
        Duration::from_secs(20),
        || async {
            client
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;

    let requests: Vec<_> = (0..20)
        .map(|i| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let response = client
                    .post(format!("{base}/api/orders"))
                    .header("X-Request-Timeout-Ms", "1000")
                    .json(&json!({"sku": format!("SKU-{:05}", 300 + i), "quantity": 1}))
                    .send()
                    .await;
                (response.map(|r| r.status().as_u16()), started.elapsed())
            })
        })
        .collect();
    wait_until(
        "the orders are in flight",
        Duration::from_secs(5),
        || async {
            let text = match client.get(format!("{base}/metrics")).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            metric_value(
                &text,
                "http_server_requests_in_flight",
                r#"uri="/api/orders""#,
            ) == Some(20.0)
        },
    )
    .await;

    let signalled = Instant::now();
    let sent = Command::new("kill")
        .args(["-TERM", &orders.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    // The listener closes at once, while the in-flight orders (400 ms of catalog latency)
    // are still being served: a load balancer's next connection goes elsewhere.
    let addr = format!("127.0.0.1:{port}");
    wait_until("new connections are refused", MS(300), || async {
        tokio::net::TcpStream::connect(&addr).await.is_err()
    })
    .await;
    assert!(
        orders.try_wait().unwrap().is_none(),
        "refused while the drain was still going on, not because the process had exited"
    );

    let mut created = 0;
    for request in requests {
        let (status, took) = request.await.unwrap();
        let status = status.expect("an in-flight request gets an answer, not a reset");
        assert!([201, 503, 504].contains(&status), "status {status}");
        assert!(
            took < MS(1000 + 100),
            "answered after {took:?}, past its 1000 ms budget"
        );
        created += usize::from(status == 201);
    }
    assert_eq!(created, 20, "each in-flight order had time to finish");

    let exited = tokio::task::spawn_blocking(move || orders.wait())
        .await
        .unwrap()
        .unwrap();
    let took = signalled.elapsed();
    assert!(exited.success(), "exit status {exited}");
    assert!(
        took < MS(MAX_BUDGET_MS + 1000),
        "exited {took:?} after SIGTERM"
    );

    // What the answers promised is what the table holds: 20 orders, each with its stock
    // decrement (the order and the decrement commit together or not at all).
    let side = sqlx::PgPool::connect(&database.url).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&side)
        .await
        .unwrap();
    assert_eq!(rows, 20);
    let untouched: i32 =
        sqlx::query_scalar("SELECT available FROM inventory WHERE sku = 'SKU-00999'")
            .fetch_one(&side)
            .await
            .unwrap();
    let decremented: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM inventory WHERE sku BETWEEN 'SKU-00300' AND 'SKU-00319' \
         AND available = $1 - 1",
    )
    .bind(untouched)
    .fetch_one(&side)
    .await
    .unwrap();
    assert_eq!(decremented, 20, "each order took exactly its stock");
}
