//! The job envelope (feature `queue`): a caller enqueues a job with what is left of its
//! budget, a worker claims it, works under what is left and fences its effect, and the
//! caller waits for the result or expires the job, in one statement, at its own time.
//! Run it on a scratch database (it drops and creates `queue_jobs` and
//! `queue_attempts`):
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/scratch \
//!     cargo run -p deadline-propagation --example queue --features queue
//! ```
//!
//! The first job's work fits its budget: done, with its result. The second's does not:
//! the worker's statement is cut at the job's deadline, the caller's expire wins, and
//! the job never takes effect.

use std::time::Duration;

use deadline_propagation::Deadline;
use deadline_propagation::db::{Db, DbConfig, End};
use deadline_propagation::queue::{Queue, QueueConfig, SCHEMA};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let db = Db::connect_lazy(&url, DbConfig::default())?;
    // In a service this is a migration (orders-service's is SCHEMA, and its own tables).
    let setup = Deadline::after(Duration::from_secs(5));
    db.transaction(&setup, |conn| {
        Box::pin(async move {
            sqlx::raw_sql("DROP TABLE IF EXISTS queue_attempts, queue_jobs")
                .execute(&mut *conn)
                .await?;
            sqlx::raw_sql(SCHEMA).execute(&mut *conn).await?;
            Ok(End::Commit(()))
        })
    })
    .await?;
    let queue = Queue::new(db, "example", QueueConfig::default());

    // The worker: claim the oldest job with time enough left, run its work under what
    // is left, and let `run` fence it. Here the work only sleeps on the server, as a
    // booking would take time; its effect would be written on the same `conn`.
    let worker = queue.clone();
    tokio::spawn(async move {
        loop {
            let Ok(Some(job)) = worker.claim().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let took = Duration::from_millis(job.payload["work_ms"].as_u64().unwrap_or(0));
            let ran = worker
                .run(job, move |conn| {
                    Box::pin(async move {
                        sqlx::query("SELECT pg_sleep($1)")
                            .bind(took.as_secs_f64())
                            .execute(&mut *conn)
                            .await?;
                        Ok(json!({ "booked": true }))
                    })
                })
                .await;
            println!("  worker: {ran:?}");
        }
    });

    // The caller: the job gets the request's deadline less 50 ms, the time to expire it
    // and answer; `wait` polls until then, then expires it.
    for (budget_ms, work_ms) in [(500, 100), (300, 400)] {
        let deadline = Deadline::after(Duration::from_millis(budget_ms));
        let by = deadline.instant() - Duration::from_millis(50);
        let job = queue
            .enqueue(&deadline, &json!({ "work_ms": work_ms }), Some(by))
            .await?;
        let status = queue.wait(&deadline, job, by).await?;
        println!(
            "a {budget_ms} ms caller, {work_ms} ms of work: job {job} {} {}",
            status.state.as_str(),
            status.result.unwrap_or_default()
        );
    }
    Ok(())
}
