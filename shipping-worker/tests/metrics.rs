//! shipping-worker's `/metrics`, scraped over HTTP, agrees with the queue's table: the
//! jobs its sweep expired unstarted, the ones it booked, and the backlog gauges.

mod common;

use std::time::Duration;

use common::{orders_service, worker_config};
use test_support::{metric_value, scrape};

/// Every family has its series from the first scrape, before any job: a dashboard's query
/// (the claim latency's p99 among them) has data on a worker that has claimed nothing.
#[tokio::test]
async fn every_series_exists_before_the_first_job() {
    let stack = orders_service(60).await;
    let app = shipping_worker::Application::build(worker_config(&stack.url, 1, 0, 0))
        .await
        .unwrap();
    let base = format!("http://127.0.0.1:{}", app.port());
    let worker = test_support::spawn(|shutdown| app.run_until(shutdown));
    let text = scrape(&reqwest::Client::new(), &base).await;
    let queue = r#"queue="shipments""#;
    for name in [
        "queue_depth",
        "queue_oldest_job_age_seconds",
        "queue_jobs_done_total",
        "queue_claim_latency_seconds_count",
    ] {
        assert_eq!(metric_value(&text, name, queue), Some(0.0), "{name}");
    }
    for at in ["queue", "fence"] {
        let labels = format!(r#"queue="shipments",at="{at}""#);
        let expired = metric_value(&text, "queue_jobs_expired_total", &labels);
        assert_eq!(expired, Some(0.0), "expired at {at}");
    }
    worker.shutdown().await;
}

#[tokio::test]
async fn the_queue_metrics_say_what_the_table_says() {
    let stack = orders_service(60).await;
    let orders = stack.seed_orders(4).await;
    // Three jobs whose deadline passes before any worker comes, one with time to spare.
    for &order in &orders[..3] {
        let (status, _) = stack.ship(order, 300, true).await;
        assert_eq!(status.as_u16(), 202);
    }
    let (status, _) = stack.ship(orders[3], 5000, true).await;
    assert_eq!(status.as_u16(), 202);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let app = shipping_worker::Application::build(worker_config(&stack.url, 2, 0, 0))
        .await
        .unwrap();
    let base = format!("http://127.0.0.1:{}", app.port());
    let worker = test_support::spawn(|shutdown| app.run_until(shutdown));
    stack.settle(Duration::from_secs(10)).await;
    let tally = stack.check_the_table().await;
    assert_eq!((tally.expired_unstarted, tally.done), (3, 1), "{tally:?}");
    let client = reqwest::Client::new();
    test_support::wait_until(
        "the gauges follow the table",
        Duration::from_secs(5),
        || async {
            let text = scrape(&client, &base).await;
            metric_value(&text, "queue_depth", r#"queue="shipments""#) == Some(0.0)
        },
    )
    .await;
    let text = scrape(&client, &base).await;
    let at = |at: &str| format!(r#"queue="shipments",at="{at}""#);
    assert_eq!(
        metric_value(&text, "queue_jobs_expired_total", &at("queue")),
        Some(3.0)
    );
    assert_eq!(
        metric_value(&text, "queue_jobs_expired_total", &at("fence")),
        Some(0.0)
    );
    assert_eq!(
        metric_value(&text, "queue_jobs_done_total", r#"queue="shipments""#),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &text,
            "queue_claim_latency_seconds_count",
            r#"queue="shipments""#
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &text,
            "queue_oldest_job_age_seconds",
            r#"queue="shipments""#
        ),
        Some(0.0)
    );
    worker.shutdown().await;
}
