//! An idle worker waits for the queue's notice instead of polling the table: a job
//! enqueued into an idle queue is claimed at once though the worker's own look is far
//! off, and idle workers cost the database a few transactions a second, read from
//! PostgreSQL's own statistics.

mod common;

use std::time::Duration;

use common::{orders_service, worker_config, worker_in_process};

/// Whether a connection of the worker's `LISTEN`s to the queue's channel.
async fn listening(db: &sqlx::PgPool) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%queue_jobs%'",
    )
    .fetch_one(db)
    .await
    .unwrap();
    n > 0
}

#[tokio::test]
async fn a_job_into_an_idle_queue_is_claimed_at_once_not_at_the_next_look() {
    let stack = orders_service(60).await;
    let order = stack.seed_orders(1).await[0];
    let mut config = worker_config(&stack.url, 2, 0, 0);
    // The worker's own look comes only every 10 s: a claim within a second is the notice's.
    config.idle_poll_ms = 10_000;
    let worker = worker_in_process(config).await;
    test_support::wait_until("the worker listens", Duration::from_secs(5), || {
        listening(&stack.db)
    })
    .await;
    let (status, _) = stack.ship(order, 5000, true).await;
    assert_eq!(status.as_u16(), 202);
    stack.settle(Duration::from_secs(5)).await;
    // Enqueue to claim, on the database's clock.
    let waited: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM a.started_at - j.enqueued_at)::float8
         FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id",
    )
    .fetch_one(&stack.db)
    .await
    .unwrap();
    assert!(waited < 1.0, "claimed {waited:.3} s after its enqueue");
    assert_eq!(stack.shipments_of(order).await, 1);
    worker.shutdown().await;
}

/// Transactions committed in the orders database so far, as PostgreSQL counts them.
async fn transactions(db: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database
         WHERE datname = current_database()",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

#[tokio::test]
async fn idle_workers_cost_the_database_a_few_transactions_a_second() {
    let stack = orders_service(60).await;
    let mut config = worker_config(&stack.url, 4, 0, 0);
    config.idle_poll_ms = shipping_worker::Config::for_tests(&stack.url).idle_poll_ms;
    config.sweep_every_ms = 1000;
    let worker = worker_in_process(config).await;
    let before = transactions(&stack.db).await;
    // A window to count in, not a wait for a condition.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let spent = transactions(&stack.db).await - before;
    println!("idle: {spent} transactions in 3 s");
    // Four workers looking each second and the housekeeping's two statements are
    // about 18 over 3 s (PostgreSQL reports a backend's counts up to a second late);
    // workers polling every 20 ms would be some 600.
    assert!(
        spent < 100,
        "{spent} transactions in 3 s with nothing to do"
    );
    worker.shutdown().await;
}
