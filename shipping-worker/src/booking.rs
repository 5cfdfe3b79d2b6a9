//! The job's work: book a pickup for an order. The effect is a row in `shipments`,
//! written in the job's transaction, so it commits with the queue's `done` or not at
//! all.

use std::time::Duration;

use deadline_propagation::queue::Work;
use serde_json::{Value, json};

/// The queue orders-service puts shipments on.
pub const QUEUE: &str = "shipments";

/// The work for job `job`: `payload` is `{"order_id": n}`. `carrier_time` stands in for
/// the carrier's booking call; it is spent in the transaction (`pg_sleep`), so the
/// job's statement limit and its cancel at the deadline stop it like any real step.
pub fn book(job: i64, payload: &Value, carrier_time: Duration) -> impl Work {
    let order_id = payload["order_id"].as_i64();
    move |conn| {
        Box::pin(async move {
            let order_id = order_id
                .ok_or_else(|| sqlx::Error::Decode("a shipment job without an order_id".into()))?;
            if !carrier_time.is_zero() {
                sqlx::query("SELECT pg_sleep($1)")
                    .bind(carrier_time.as_secs_f64())
                    .execute(&mut *conn)
                    .await?;
            }
            // No unique key on the job: at most one shipment per job is the fence's
            // promise, and the tests count the rows to hold it to that.
            let (id, carrier): (i64, String) = sqlx::query_as(
                "INSERT INTO shipments (order_id, job_id, carrier, booked_at)
                 VALUES ($1, $2, 'parcel-express', clock_timestamp())
                 RETURNING id, carrier",
            )
            .bind(order_id)
            .bind(job)
            .fetch_one(&mut *conn)
            .await?;
            Ok(json!({ "shipment_id": id, "order_id": order_id, "carrier": carrier }))
        })
    }
}
