//! PostgreSQL under the deadline: server-side cancellation, clean connections, restarts.

mod common;

use common::{MS, json_of, own_cluster, sleep_on_server, spawn_app, spawn_app_on};
use futures_util::future::join_all;
use reqwest::StatusCode;
use shared::{Deadline, Stage};
use test_support::wait_until;
use tokio::time::Instant;

#[tokio::test]
async fn a_long_statement_is_cancelled_by_the_server_at_the_budget() {
    let app = spawn_app().await;
    let deadline = Deadline::after(MS(300));
    let started = Instant::now();
    let result = sleep_on_server(&app.state.db, &deadline).await;
    let took = started.elapsed();
    match result {
        Err(shared::db::DbError::Deadline(exceeded)) => assert_eq!(exceeded.stage, Stage::Db),
        other => panic!("expected a deadline error, got {other:?}"),
    }
    assert!(took < MS(400), "took {took:?}");
    // A client-side timeout alone would leave pg_sleep running for 5 s.
    wait_until("no pg_sleep runs on the server", MS(200), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%' AND state = 'active'",
        )
        .fetch_one(&app.side)
        .await
        .unwrap()
            == 0
    })
    .await;
}

#[tokio::test]
async fn orders_answer_503_while_postgres_is_down_and_recover_when_it_is_back() {
    let (cluster, database) = own_cluster().await;
    let app = spawn_app_on(database, |_| {}).await;
    assert_eq!(
        app.order("SKU-00001", 1, None).await.status(),
        StatusCode::CREATED
    );
    app.side.close().await;

    let cluster = std::sync::Arc::new(cluster);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop())
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let response = app.order("SKU-00001", 1, Some(1000)).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    assert!(started.elapsed() < MS(1000));
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.resume())
        .await
        .unwrap()
        .unwrap();
    wait_until(
        "orders succeed again",
        std::time::Duration::from_secs(10),
        || async { app.order("SKU-00001", 1, None).await.status() == StatusCode::CREATED },
    )
    .await;
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), StatusCode::OK);
}

#[tokio::test]
async fn ten_identical_retries_at_once_make_one_order() {
    let app = spawn_app().await;
    let before = app.stock("SKU-00010").await;
    let body = serde_json::json!({"sku": "SKU-00010", "quantity": 2});
    let calls = (0..10).map(|_| app.post_order(body.clone(), Some(2000), Some("retry-me")));
    let responses = join_all(calls).await;
    let mut ids = Vec::new();
    for response in responses {
        assert_eq!(response.status(), StatusCode::CREATED);
        ids.push(json_of(response).await["id"].as_i64().unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every retry got the same order");
    assert_eq!(app.order_rows().await, 1);
    assert_eq!(app.stock("SKU-00010").await, before - 2);
}
