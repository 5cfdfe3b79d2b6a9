//! What an answer promises (docs/design.md §5), held against the system of record: the `orders`
//! table and `pg_stat_activity`, never the service's own bookkeeping.
//!
//! - a 201 means the order is committed; a 504, 503 or 502 means nothing was written,
//!   also when the budget runs out during a slow COMMIT;
//! - a request cancelled mid-statement (client gone) stops on the server and costs no
//!   connection: the pool's sessions are the same PIDs before and after;
//! - every read path is bounded on the server, not only on the client.

mod common;

use std::collections::BTreeSet;

use common::{MS, TestApp, json_of, spawn_app};
use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;
use test_support::wait_until;
use tokio::time::Instant;

/// The stock update sleeps 120 ms (a `BEFORE UPDATE` trigger) and COMMIT 150 ms (a
/// deferred constraint trigger on the new order), so budgets around 300 ms run out in
/// every possible place: the statement, just before COMMIT, and during it.
async fn make_writes_slow(app: &TestApp) {
    sqlx::raw_sql(
        "CREATE FUNCTION slow_update() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(0.12); RETURN NEW; END $$; \
         CREATE TRIGGER slow_update BEFORE UPDATE ON inventory \
             FOR EACH ROW EXECUTE FUNCTION slow_update(); \
         CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(0.15); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON orders \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
    )
    .execute(&app.side)
    .await
    .expect("slow triggers installed");
    // As after a migration: the service reads that the schema now defers work.
    assert!(app.state.db.learn_schema().await.unwrap());
}

/// Waits until the service has nothing running on the server, so the table shows the
/// final effect of the request just answered (a COMMIT the answer did not wait for
/// would land here).
async fn settled(app: &TestApp) {
    wait_until("the service runs no statement", MS(3000), || async {
        app.service_statements_in_flight().await == 0
    })
    .await;
}

#[tokio::test]
async fn every_answer_across_a_slow_commit_agrees_with_the_table() {
    let app = spawn_app().await;
    make_writes_slow(&app).await;
    let mut disagreements = Vec::new();
    let mut statuses = Vec::new();
    for budget in (120..=450).step_by(10) {
        let before = app.order_rows().await;
        let started = Instant::now();
        let response = app.order("SKU-00021", 1, Some(budget)).await;
        let took = started.elapsed();
        let status = response.status();
        settled(&app).await;
        let written = app.order_rows().await - before;
        let truthful = match status.as_u16() {
            201 => written == 1,
            502..=504 => written == 0,
            _ => false,
        };
        if !truthful {
            disagreements.push(format!(
                "{budget} ms budget: {status} after {took:?}, {written} row(s) written"
            ));
        }
        statuses.push(status.as_u16());
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} answers disagree with the table:\n{}",
        disagreements.len(),
        statuses.len(),
        disagreements.join("\n")
    );
    // The sweep must cross the interesting region: some budgets fail, some succeed.
    assert!(
        statuses.contains(&201),
        "no budget was enough: {statuses:?}"
    );
    assert!(statuses.contains(&504), "no budget ran out: {statuses:?}");
}

/// Fills the service's pool: `n` orders wait on a locked row at once, so the pool opens
/// `n` sessions; then the lock goes and they all complete.
async fn fill_pool(app: &TestApp, n: usize) {
    let mut locker = app.side_connection().await;
    let mut lock = locker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM inventory WHERE sku = 'SKU-00008' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let orders = join_all((0..n).map(|_| app.order("SKU-00008", 1, Some(2000))));
    let release = async {
        wait_until(
            "every pooled session waits on the lock",
            MS(2000),
            || async { app.service_lock_waiters().await == n as i64 },
        )
        .await;
        lock.rollback().await.unwrap();
    };
    let (responses, ()) = tokio::join!(orders, release);
    for response in responses {
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    settled(app).await;
}

#[tokio::test]
async fn clients_that_hang_up_mid_lock_wait_cost_no_pooled_connection() {
    let app = spawn_app().await;
    fill_pool(&app, 16).await;
    let before = app.service_backends().await;
    assert_eq!(before.len(), 16, "the pool opened 16 sessions");

    let mut locker = app.side_connection().await;
    let mut lock = locker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM inventory WHERE sku = 'SKU-00007' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // 30 clients give a 1500 ms budget and hang up after 150 ms.
    let sent = Instant::now();
    let impatient = reqwest::Client::builder().timeout(MS(150)).build().unwrap();
    let hang_ups = (0..30).map(|_| {
        impatient
            .post(format!("{}/api/orders", app.base))
            .header("X-Request-Timeout-Ms", "1500")
            .json(&json!({"sku": "SKU-00007", "quantity": 1}))
            .send()
    });
    for outcome in join_all(hang_ups).await {
        assert!(outcome.is_err(), "the client hung up before any answer");
    }
    // Their statements stop on the server before the 1500 ms budget would stop them:
    // what is left of it, less 200 ms, is the bound.
    let bound = MS(1500)
        .saturating_sub(sent.elapsed())
        .saturating_sub(MS(200));
    wait_until("no statement waits on the lock", bound, || async {
        app.service_lock_waiters().await == 0
    })
    .await;
    lock.rollback().await.unwrap();
    settled(&app).await;

    let after = app.service_backends().await;
    let closed: BTreeSet<_> = before.difference(&after).collect();
    assert!(
        closed.is_empty(),
        "{} of {} pooled sessions were closed by the hang-ups (reconnects)",
        closed.len(),
        before.len()
    );
    assert_eq!(app.backends_in_state("idle in transaction").await, 0);
    assert_eq!(
        app.order_rows_for("SKU-00007").await,
        0,
        "nothing was written"
    );
    // The same sessions serve the next orders.
    for _ in 0..16 {
        let response = app.order("SKU-00007", 1, Some(1000)).await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    assert!(app.service_backends().await.is_superset(&before));
}

#[tokio::test]
async fn a_statement_cut_by_the_server_limit_keeps_its_connection() {
    let app = spawn_app().await;
    fill_pool(&app, 4).await;
    let before = app.service_backends().await;
    let mut locker = app.side_connection().await;
    let mut lock = locker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM inventory WHERE sku = 'SKU-00003' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();

    let started = Instant::now();
    let response = app.order("SKU-00003", 1, Some(500)).await;
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(json_of(response).await["stage"], "db");
    assert!(took < MS(650), "answered after {took:?}");
    assert_eq!(app.service_lock_waiters().await, 0, "the server stopped it");
    lock.rollback().await.unwrap();
    settled(&app).await;
    assert!(
        app.service_backends().await.is_superset(&before),
        "no pooled session was closed"
    );
    assert_eq!(app.order_rows_for("SKU-00003").await, 0);
    // The same sessions serve the next orders, and the stock is exact.
    let stock = app.stock("SKU-00003").await;
    for _ in 0..10 {
        let response = app.order("SKU-00003", 1, Some(1000)).await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    assert_eq!(app.stock("SKU-00003").await, stock - 10);
    assert!(app.service_backends().await.is_superset(&before));
}

#[tokio::test]
async fn every_read_path_stops_on_the_server_at_its_deadline() {
    let app = spawn_app().await;
    let placed = app
        .post_order(
            json!({"sku": "SKU-00005", "quantity": 1}),
            None,
            Some("read-paths"),
        )
        .await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    let id = json_of(placed).await["id"].as_i64().unwrap();

    let mut locker = app.side_connection().await;
    let mut lock = locker.begin().await.unwrap();
    sqlx::raw_sql("LOCK TABLE orders, inventory IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let reads = (0..8).map(|_| async {
        app.client
            .get(format!("{}/api/orders/{id}", app.base))
            .header("X-Request-Timeout-Ms", "300")
            .send()
            .await
            .unwrap()
            .status()
    });
    let replays = (0..4).map(|_| async {
        app.post_order(
            json!({"sku": "SKU-00005", "quantity": 1}),
            Some(300),
            Some("read-paths"),
        )
        .await
        .status()
    });
    let stock_tool = async {
        app.client
            .post(format!("{}/api/assistant/chat", app.base))
            .header("X-Request-Timeout-Ms", "300")
            .json(&json!({"message": "How many SKU-00005 are in stock?"}))
            .send()
            .await
            .unwrap()
            .status()
    };
    let started = Instant::now();
    let (reads, replays, tool) = tokio::join!(join_all(reads), join_all(replays), stock_tool);
    let answered = started.elapsed();
    assert!(
        reads.iter().all(|s| *s == StatusCode::GATEWAY_TIMEOUT),
        "{reads:?}"
    );
    assert!(
        replays.iter().all(|s| *s == StatusCode::GATEWAY_TIMEOUT),
        "{replays:?}"
    );
    assert!(
        tool.is_success() || tool == StatusCode::GATEWAY_TIMEOUT,
        "{tool}"
    );
    assert!(answered < MS(500), "answered after {answered:?}");
    // Within 200 ms of the answers, nothing of theirs still waits on the lock.
    wait_until(
        "no statement waits on the locked tables",
        MS(200),
        || async { app.service_lock_waiters().await == 0 },
    )
    .await;
    lock.rollback().await.unwrap();
}
