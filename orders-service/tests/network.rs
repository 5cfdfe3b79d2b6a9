//! The promise across a real network: links cut with `iptables` (test_support::net)
//! while orders are in flight. Each test owns the server it cuts (its own PostgreSQL
//! cluster, its own catalog) and watches the database through its UNIX socket, which
//! the cut does not reach, so `pg_stat_activity` and `pg_locks` are read during the
//! partition. The answers are held against the table, the locks and `/metrics`.

mod common;

use std::time::Duration;

use common::{MS, TEST_SESSION, TestApp, own_cluster, spawn_app_on};
use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};
use test_support::net::{Direction, Link};
use test_support::{PgCluster, metric_value, wait_until};
use tokio::time::Instant;

/// The longest budget the service grants (`DEADLINE_MAX_MS`): the measured case.
const BUDGET_MS: u64 = 2000;
/// How late past its deadline an answer may come (a loaded 2-core machine).
const ANSWER_SLACK: Duration = Duration::from_millis(50);
/// How long past its deadline a COMMIT's outcome may be learned (docs/design.md §5).
const COMMIT_GRACE: Duration = Duration::from_millis(250);
/// How long past its deadline a transaction may live on the server.
const SERVER_SLACK: Duration = Duration::from_millis(1000);

/// A test's own cluster, the app on it, and the test's view of the database through
/// the UNIX socket.
async fn app_on_own_cluster() -> (PgCluster, TestApp) {
    let (cluster, database) = own_cluster().await;
    let mut app = spawn_app_on(database, |_| {}).await;
    app.side = observer(&cluster).await;
    (cluster, app)
}

async fn observer(cluster: &PgCluster) -> PgPool {
    let options: PgConnectOptions = cluster.socket_url("postgres").parse().unwrap();
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.application_name(TEST_SESSION))
        .await
        .expect("an observer through the UNIX socket")
}

async fn socket_session(cluster: &PgCluster) -> PgConnection {
    let options: PgConnectOptions = cluster.socket_url("postgres").parse().unwrap();
    PgConnection::connect_with(&options.application_name(TEST_SESSION))
        .await
        .expect("a session through the UNIX socket")
}

/// Whether another session can take `sku`'s row lock right now (`NOWAIT`: refused at
/// once while anyone holds it).
async fn row_lock_is_free(app: &TestApp, sku: &str) -> bool {
    let mut tx = app.side.begin().await.unwrap();
    let locked = sqlx::query("SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE NOWAIT")
        .bind(sku)
        .execute(&mut *tx)
        .await;
    let _ = tx.rollback().await;
    locked.is_ok()
}

/// The service's sessions inside a transaction (idle in it, aborted or running).
async fn service_transactions(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' \
         AND application_name <> $1 AND xact_start IS NOT NULL",
    )
    .bind(TEST_SESSION)
    .fetch_one(&app.side)
    .await
    .unwrap()
}

fn order_body(sku: &str) -> Value {
    json!({"sku": sku, "quantity": 1})
}

/// Posts an order in the background; the answer and how long it took.
fn order_in_background(
    app: &TestApp,
    sku: &str,
    key: Option<&'static str>,
) -> tokio::task::JoinHandle<(StatusCode, Value, Duration)> {
    let client = app.client.clone();
    let url = format!("{}/api/orders", app.base);
    let body = order_body(sku);
    tokio::spawn(async move {
        let started = Instant::now();
        let mut request = client
            .post(url)
            .header("X-Request-Timeout-Ms", BUDGET_MS)
            .json(&body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.expect("an answer");
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        (status, body, started.elapsed())
    })
}

/// The partition during a statement, checked the same way for a lock wait and a
/// statement that runs: the answer by the deadline, stage `db`; the row lock free and
/// the transaction gone from the server by the deadline + 1 s while the link is still
/// cut; nothing written; after the heal, the SKU orderable within a second.
async fn cut_during_a_statement(
    app: &TestApp,
    link: &Link,
    sku: &str,
    release: impl AsyncFnOnce(),
) {
    let stock = app.stock(sku).await;
    let started = Instant::now();
    let deadline = started + MS(BUDGET_MS);
    let order = order_in_background(app, sku, None);
    wait_until(
        "the order's statement is on the server",
        MS(2000),
        || async { service_transactions(app).await == 1 },
    )
    .await;
    tokio::time::sleep_until(started + MS(300)).await; // as measured: 300 ms in
    link.partition();
    release().await;

    let (status, body, took) = order.await.unwrap();
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(
        body["stage"], "db",
        "the time ran out in the database: {body}"
    );
    assert!(
        took <= MS(BUDGET_MS) + ANSWER_SLACK,
        "answered after {took:?}"
    );

    let bound = (deadline + SERVER_SLACK).saturating_duration_since(Instant::now());
    wait_until(
        "the row lock is free, the partition lasting",
        bound,
        || async { row_lock_is_free(app, sku).await },
    )
    .await;
    wait_until(
        "no transaction of the service is left on the server",
        MS(100),
        || async { service_transactions(app).await == 0 },
    )
    .await;
    assert_eq!(app.order_rows_for(sku).await, 0, "nothing written");
    assert_eq!(app.stock(sku).await, stock, "no stock taken");

    // `PARTITION_SECONDS=150` holds the cut that long before the heal, as measured in
    // the issue this answers; by default the test heals as soon as it has seen enough.
    let hold: u64 = std::env::var("PARTITION_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep_until(started + Duration::from_secs(hold)).await;
    assert!(
        row_lock_is_free(app, sku).await,
        "a ghost came back during the cut"
    );
    link.heal();
    let healed = Instant::now();
    wait_until("the SKU is orderable again", MS(1000), || async {
        app.post_order(order_body(sku), Some(500), None)
            .await
            .status()
            == StatusCode::CREATED
    })
    .await;
    assert!(healed.elapsed() <= MS(1000));
}

#[tokio::test]
async fn a_partition_while_the_statement_waits_on_a_lock_leaves_no_ghost_holding_it() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (cluster, app) = app_on_own_cluster().await;
    let link = Link::to(cluster.port());
    // Another session holds the SKU's row; the order's statement waits for it. Then the
    // holder commits, so the order's statement finishes on the server with nobody left
    // to read its result, and its transaction holds the row lock it just took.
    let mut holder = socket_session(&cluster).await;
    sqlx::raw_sql("BEGIN; SELECT 1 FROM inventory WHERE sku = 'SKU-00042' FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    cut_during_a_statement(&app, &link, "SKU-00042", async || {
        sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_partition_while_the_statement_runs_leaves_no_ghost_on_the_server() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (cluster, app) = app_on_own_cluster().await;
    let link = Link::to(cluster.port());
    // Ten seconds of work in the order's statement: a BEFORE trigger on its stock row.
    sqlx::raw_sql(
        "CREATE FUNCTION slow_stock() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(10); RETURN NEW; END $$; \
         CREATE TRIGGER slow_stock BEFORE UPDATE ON inventory FOR EACH ROW \
         WHEN (OLD.sku = 'SKU-00043') EXECUTE FUNCTION slow_stock()",
    )
    .execute(&app.side)
    .await
    .unwrap();
    cut_during_a_statement(&app, &link, "SKU-00043", async || {
        // Later statements are quick again (the one running keeps its ten seconds):
        // replacing the function takes no lock on the table the ghost holds.
        sqlx::raw_sql(
            "CREATE OR REPLACE FUNCTION slow_stock() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RETURN NEW; END $$",
        )
        .execute(&app.side)
        .await
        .unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_partition_during_commit_is_never_a_504_and_a_replay_tells_the_table() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (cluster, app) = app_on_own_cluster().await;
    let link = Link::to(cluster.port());
    // 300 ms of deferred work at COMMIT (fired by the COMMIT batch's
    // `SET CONSTRAINTS ALL IMMEDIATE`): the partition starts while it runs, so the
    // server commits with nobody left to hear it.
    sqlx::raw_sql(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON orders \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()",
    )
    .execute(&app.side)
    .await
    .unwrap();
    // As after a migration: the service reads that the schema now defers work.
    assert!(app.state.db.learn_schema().await.unwrap());
    let order = order_in_background(&app, "SKU-00044", Some("k-cut-commit"));
    common::wait_for_one_waiting_on(&app.side, "PgSleep").await;
    link.partition();
    let (status, body, took) = order.await.unwrap();
    assert!(
        status == StatusCode::CREATED
            || (status == StatusCode::INTERNAL_SERVER_ERROR
                && body["type"] == "urn:problem:outcome-unknown"),
        "a COMMIT on the wire is answered by its outcome or as unknown, got {status} {body}"
    );
    assert!(
        // A COMMIT on the wire is answered within its grace, 250 ms (docs/design.md §5).
        took <= MS(BUDGET_MS) + COMMIT_GRACE + ANSWER_SLACK,
        "answered after {took:?}"
    );
    link.heal();

    let written: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE idempotency_key = $1")
        .bind("k-cut-commit")
        .fetch_one(&app.side)
        .await
        .unwrap();
    let replay = app
        .post_order(
            order_body("SKU-00044"),
            Some(BUDGET_MS),
            Some("k-cut-commit"),
        )
        .await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    let replayed = replay.headers().get("idempotent-replayed").is_some();
    assert_eq!(
        replayed,
        written == 1,
        "the replay says what the table says ({written} row with the key)"
    );
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE idempotency_key = $1")
        .bind("k-cut-commit")
        .fetch_one(&app.side)
        .await
        .unwrap();
    assert_eq!(after, 1, "one order for the key, whatever the cut did");
}

/// A COMMIT past its commit record, waiting for a synchronous standby that never
/// answers, when the link to the database is cut both ways: neither the cancel at the
/// deadline nor a look at the table can get through, so the outcome is unknown. The
/// answer says so (500 `outcome-unknown`, never a 504) within the COMMIT's grace, 250 ms
/// past the deadline (docs/design.md §5), whatever the network does; after the heal a
/// replay with the same key finds the one row.
#[tokio::test]
async fn a_commit_cut_off_while_it_waits_for_a_standby_is_answered_within_its_grace() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (cluster, database) = own_cluster().await;
    let url = database.url.clone();
    let mut app = spawn_app_on(database, |_| {}).await;
    app.side = observer(&cluster).await;
    common::wait_for_a_ghost_standby(&url, &app.side).await;
    let link = Link::to(cluster.port());
    let order = order_in_background(&app, "SKU-00045", Some("k-cut-standby"));
    common::wait_for_one_waiting_on(&app.side, "SyncRep").await;
    link.partition();
    let (status, body, took) = order.await.unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["type"], "urn:problem:outcome-unknown", "{body}");
    assert!(
        took <= MS(BUDGET_MS) + COMMIT_GRACE + ANSWER_SLACK,
        "answered after {took:?}"
    );
    // Release the waiting COMMIT (it has committed locally), then heal.
    for sql in [
        "ALTER SYSTEM RESET synchronous_standby_names",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::query(sql).execute(&app.side).await.unwrap();
    }
    link.heal();
    let replay = app
        .post_order(
            order_body("SKU-00045"),
            Some(BUDGET_MS),
            Some("k-cut-standby"),
        )
        .await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE idempotency_key = $1")
        .bind("k-cut-standby")
        .fetch_one(&app.side)
        .await
        .unwrap();
    assert_eq!(rows, 1, "one order for the key");
}

#[tokio::test]
async fn pooled_connections_to_a_server_that_vanished_are_replaced_by_themselves() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (cluster, app) = app_on_own_cluster().await;
    // The pool holds connections to the server.
    let skus: Vec<String> = (0..4).map(|i| format!("SKU-0010{i}")).collect();
    let warm = join_all(skus.iter().map(|sku| app.order(sku, 1, Some(1000)))).await;
    assert!(warm.iter().all(|r| r.status() == StatusCode::CREATED));
    let link = Link::to(cluster.port());
    link.partition();
    // While the link is cut, every order is answered within its budget.
    for sku in ["SKU-00110", "SKU-00111"] {
        let started = Instant::now();
        let response = app.order(sku, 1, Some(500)).await;
        let took = started.elapsed();
        assert!(
            [StatusCode::SERVICE_UNAVAILABLE, StatusCode::GATEWAY_TIMEOUT]
                .contains(&response.status()),
            "{}",
            response.status()
        );
        assert!(took <= MS(500) + ANSWER_SLACK, "answered after {took:?}");
    }
    // The server restarts behind the cut: every pooled connection now leads nowhere.
    let _cluster = tokio::task::spawn_blocking(move || {
        cluster.stop().unwrap();
        cluster.resume().unwrap();
        cluster
    })
    .await
    .unwrap();
    link.heal();
    // Each order after the heal is answered within its budget, and the pool heals
    // without anyone's help: 201s again within a second.
    let healed = Instant::now();
    let mut first_created = None;
    while healed.elapsed() < MS(3000) {
        let started = Instant::now();
        let response = app.order("SKU-00120", 1, Some(500)).await;
        assert!(started.elapsed() <= MS(500) + ANSWER_SLACK);
        if response.status() == StatusCode::CREATED {
            first_created = Some(healed.elapsed());
            break;
        }
    }
    let first = first_created.expect("an order placed after the heal");
    assert!(
        first <= MS(1000),
        "the first 201 came {first:?} after the heal"
    );
}

/// Orders from `clients` callers at once for `period`, each with `budget_ms`: the
/// answers' statuses and the slowest one.
async fn load(
    app: &TestApp,
    clients: usize,
    period: Duration,
    budget_ms: u64,
) -> (Vec<StatusCode>, Duration) {
    let until = Instant::now() + period;
    let runs = (0..clients).map(|i| async move {
        let mut seen = Vec::new();
        let mut slowest = Duration::ZERO;
        while Instant::now() < until {
            let started = Instant::now();
            let response = app
                .order(&format!("SKU-002{i:02}"), 1, Some(budget_ms))
                .await;
            slowest = slowest.max(started.elapsed());
            seen.push(response.status());
        }
        (seen, slowest)
    });
    let results = join_all(runs).await;
    let slowest = results.iter().map(|(_, s)| *s).max().unwrap_or_default();
    (
        results.into_iter().flat_map(|(seen, _)| seen).collect(),
        slowest,
    )
}

fn catalog_port(app: &TestApp) -> u16 {
    app.catalog_url.rsplit(':').next().unwrap().parse().unwrap()
}

/// A blackholed catalog, as `cut` makes it: every answer by its budget, 504 `catalog`
/// or 503; the bulkhead's slots back to 0; the first 201 within a second of the heal.
async fn blackholed_catalog(cut: impl FnOnce(&Link)) {
    let (_cluster, app) = app_on_own_cluster().await;
    // Pooled keep-alive connections to the catalog, as in production.
    let (warm, _) = load(&app, 8, MS(300), 500).await;
    assert!(warm.iter().all(|s| *s == StatusCode::CREATED), "{warm:?}");
    let link = Link::to(catalog_port(&app));
    cut(&link);
    let (answers, slowest) = load(&app, 8, MS(1500), 500).await;
    assert!(!answers.is_empty());
    assert!(
        answers
            .iter()
            .all(|s| [StatusCode::GATEWAY_TIMEOUT, StatusCode::SERVICE_UNAVAILABLE].contains(s)),
        "{answers:?}"
    );
    assert!(
        slowest <= MS(500) + ANSWER_SLACK,
        "the slowest answer took {slowest:?}"
    );
    link.heal();
    let healed = Instant::now();
    wait_until("an order is placed after the heal", MS(1000), || async {
        app.order("SKU-00299", 1, Some(500)).await.status() == StatusCode::CREATED
    })
    .await;
    assert!(healed.elapsed() <= MS(1000));
    wait_until("every bulkhead slot is back", MS(1000), || async {
        let text = app.scrape(&app.base).await;
        metric_value(
            &text,
            "http_client_pool_active_connections",
            r#"client="catalog""#,
        ) == Some(0.0)
    })
    .await;
}

#[tokio::test]
async fn a_blackholed_catalog_is_answered_by_the_budget_and_recovers_at_the_heal() {
    if !test_support::net::can_cut_links() {
        return;
    }
    blackholed_catalog(Link::partition).await;
}

#[tokio::test]
async fn a_catalog_whose_answers_are_lost_is_answered_by_the_budget_and_recovers() {
    if !test_support::net::can_cut_links() {
        return;
    }
    blackholed_catalog(|link| link.cut(Direction::ToClient)).await;
}

#[tokio::test]
async fn the_budget_sent_to_the_catalog_leaves_room_for_the_wire() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (_cluster, app) = app_on_own_cluster().await;
    let link = Link::to(catalog_port(&app));
    // Every request waits 100 ms ± 50 ms on its way to the catalog.
    link.delay(Direction::ToServer, MS(100), MS(50));
    let budget_ms = 700;
    let mut took = Vec::new();
    for i in 0..30 {
        let started = Instant::now();
        let response = app
            .order(&format!("SKU-003{i:02}"), 1, Some(budget_ms))
            .await;
        took.push(started.elapsed());
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    took.sort();
    let p99 = took[took.len() * 99 / 100];
    assert!(p99 <= MS(budget_ms), "p99 {p99:?}");
    // Once a few calls have measured the wire, the catalog is given what is left less
    // the round trip's wire time: its answer, however late it starts, can still come
    // back in time. Without that it would get the whole remainder (~690 ms) though
    // 50 to 150 ms of it are spent on the wire before it even sees the request.
    let budgets = app.catalog_budgets.lock().unwrap().clone();
    let learned: Vec<u64> = budgets
        .iter()
        .skip(5)
        .map(|b| b.expect("a budget"))
        .collect();
    let median = {
        let mut sorted = learned.clone();
        sorted.sort_unstable();
        sorted[sorted.len() / 2]
    };
    assert!(
        median <= budget_ms - 5 - 50,
        "the catalog got a median of {median} ms of a {budget_ms} ms budget: {learned:?}"
    );
    assert!(
        median >= budget_ms - 5 - 250,
        "too much taken off: {learned:?}"
    );
}
