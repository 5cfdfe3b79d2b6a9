//! Wakes idle workers when a job is enqueued, instead of each polling the table: one
//! connection `LISTEN`s to the queue's channel (every enqueue notifies it at COMMIT),
//! and each notice for this queue wakes one idle worker to claim: a notice is one job,
//! and waking every idle worker for it would send the database a herd of claims that
//! find nothing. A notice can be lost with its connection, and an abandoned job's lease
//! lapses without one, so a worker still looks on its own every
//! `SHIPPING_IDLE_POLL_MS`; after a lost connection every idle worker looks at once.

use std::sync::Arc;
use std::time::Duration;

use deadline_propagation::queue::CHANNEL;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How long after a failed `LISTEN` it is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// Listens until `stop`, waking an `idle` worker for each notice naming `queue`.
pub async fn listen(url: String, queue: &'static str, idle: Arc<Notify>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        if let Err(err) = listen_once(&url, queue, &idle, &stop).await {
            tracing::warn!(error = %err, "cannot listen for new jobs; the workers poll");
        }
        // Whatever was notified while no one listened: every idle worker looks.
        idle.notify_waiters();
        tokio::select! {
            () = tokio::time::sleep(RETRY) => {}
            () = stop.cancelled() => {}
        }
    }
}

async fn listen_once(
    url: &str,
    queue: &str,
    idle: &Notify,
    stop: &CancellationToken,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    listener.listen(CHANNEL).await?;
    // Jobs enqueued before the listen took effect.
    idle.notify_waiters();
    loop {
        let notice = tokio::select! {
            notice = listener.try_recv() => notice?,
            () = stop.cancelled() => return Ok(()),
        };
        match notice {
            // With no worker idle, the wake is kept for the next one to wait (it then
            // looks once more): a worker that finished a job looks again anyway.
            Some(notice) if notice.payload() == queue => idle.notify_one(),
            Some(_) => {}
            // The connection was lost (the next call reconnects): notices may be gone.
            None => idle.notify_waiters(),
        }
    }
}
