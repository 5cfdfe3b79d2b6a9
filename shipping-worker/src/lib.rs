//! shipping-worker: the queue hop of the demo. orders-service enqueues a shipment for an
//! order (`POST /api/orders/{id}/shipments`) on a queue in its own database; this
//! worker claims each job, books the pickup under what is left of the job's deadline,
//! and commits the shipment together with the job's `done`, or not at all
//! (`deadline_propagation::queue`).
//!
//! # Module map
//!
//! - [`config`]: settings from the environment and `--flags`.
//! - [`booking`]: the job's work, the shipment row.
//! - [`metrics`]: the queue's depth, its oldest job's age, jobs expired, claim latency.
//! - [`wake`]: idle workers woken by the queue's notices, not by polling.
//!
//! The worker has no mode of its own: a job carries its deadline, or none (legacy), and
//! the worker honours what it carries.

pub mod booking;
pub mod config;
pub mod metrics;
pub mod wake;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use deadline_propagation::Deadline;
use deadline_propagation::db::{Db, DbConfig};
use deadline_propagation::queue::{Queue, QueueConfig, Ran};
use service_kit::server::{ServerOptions, serve};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use config::Config;
pub use metrics::QueueMetrics;

/// A built, bound shipping-worker, not yet working.
pub struct Application {
    listener: TcpListener,
    port: u16,
    queue: Queue,
    db: Db,
    metrics: deadline_propagation::metrics::Metrics,
    queue_metrics: QueueMetrics,
    config: Config,
}

impl Application {
    /// Connects (lazily: the worker starts while the database is down) and binds.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let (metrics, queue_metrics) =
            QueueMetrics::for_service(booking::QUEUE, config.runtime_metrics);
        let mut db_config = DbConfig::default();
        // A connection per worker, one for housekeeping, one for a lost COMMIT's check.
        db_config.max_connections = config.workers + 2;
        let db = Db::connect_lazy(config.database_url.expose(), db_config)
            .context("DATABASE_URL is not a valid PostgreSQL URL")?
            .with_metrics(&metrics);
        let mut queue_config = QueueConfig::default();
        queue_config.min_useful = Config::ms(config.min_useful_ms);
        queue_config.lease = Config::ms(config.lease_ms);
        queue_config.max_attempts = config.max_attempts;
        let queue = Queue::new(db.clone(), booking::QUEUE, queue_config);
        let listener = TcpListener::bind(config.listen_addr)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {} (SHIPPING_LISTEN_ADDR)",
                    config.listen_addr
                )
            })?;
        Ok(Self {
            port: listener.local_addr()?.port(),
            listener,
            queue,
            db,
            metrics,
            queue_metrics,
            config,
        })
    }

    /// The port of /metrics and /healthz.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Works and serves until `shutdown` resolves; then claims nothing more and lets
    /// the jobs in hand end (each within its deadline or lease).
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let stop = CancellationToken::new();
        let trigger = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            trigger.cancel();
        });
        let routes = Router::new().route("/healthz", get(|| async { "ok" }));
        let routes = deadline_propagation::measure(routes, &self.metrics);
        let options = ServerOptions::default();
        let idle = Arc::new(Notify::new());
        let url = self.config.database_url.expose().to_owned();
        let listener = tokio::spawn(wake::listen(
            url,
            booking::QUEUE,
            idle.clone(),
            stop.clone(),
        ));
        let workers = (0..self.config.workers).map(|_| {
            tokio::spawn(work(
                self.queue.clone(),
                self.queue_metrics.clone(),
                self.config.clone(),
                idle.clone(),
                stop.clone(),
            ))
        });
        let workers: Vec<_> = workers.collect();
        let housekeeping = tokio::spawn(housekeeping(
            self.queue.clone(),
            self.queue_metrics.clone(),
            Config::ms(self.config.sweep_every_ms),
            stop.clone(),
        ));
        serve(
            self.listener,
            routes,
            stop.clone().cancelled_owned(),
            options,
        )
        .await;
        for worker in workers {
            let _ = worker.await;
        }
        let _ = housekeeping.await;
        let _ = listener.await;
        self.db.close().await;
    }
}

/// One worker: claim, book, repeat; an idle one waits for a notice (or its own next
/// look), a failing one a little.
async fn work(
    queue: Queue,
    metrics: QueueMetrics,
    config: Config,
    idle: Arc<Notify>,
    stop: CancellationToken,
) {
    let poll = Config::ms(config.idle_poll_ms);
    while !stop.is_cancelled() {
        // Waiting for a notice from before the claim looks: a job enqueued while it
        // looks wakes this worker too.
        let mut notified = pin!(idle.notified());
        notified.as_mut().enable();
        let job = match queue.claim().await {
            Ok(Some(job)) => job,
            Ok(None) => {
                tokio::select! {
                    () = notified => {}
                    () = pause(poll, &stop) => {}
                }
                continue;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot claim a job");
                pause(poll, &stop).await;
                continue;
            }
        };
        metrics.claimed(job.waited);
        let jitter = rand::random_range(0..=config.work_jitter_ms);
        let carrier = Config::ms(config.work_ms + jitter);
        let (id, attempt) = (job.id, job.attempt);
        let booking = booking::book(id, &job.payload, carrier);
        match queue.run(job, booking).await {
            Ok(Ran::Done(_)) => metrics.done(),
            Ok(Ran::Fenced) => metrics.expired("fence", 1),
            Err(err) => tracing::warn!(job = id, attempt, error = %err, "a booking failed"),
        }
    }
}

/// Every `every`: expires the jobs no worker will start, and reads the backlog.
async fn housekeeping(
    queue: Queue,
    metrics: QueueMetrics,
    every: Duration,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        match queue.sweep().await {
            Ok(swept) => metrics.expired("queue", swept),
            Err(err) => tracing::warn!(error = %err, "cannot expire the queue's lapsed jobs"),
        }
        match queue
            .backlog(&Deadline::after(every.max(Duration::from_secs(1))))
            .await
        {
            Ok((depth, oldest)) => metrics.backlog(depth, oldest),
            Err(err) => tracing::warn!(error = %err, "cannot read the queue's backlog"),
        }
        pause(every, &stop).await;
    }
}

/// Sleeps for `duration`, or until `stop`.
async fn pause(duration: Duration, stop: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(duration) => {}
        () = stop.cancelled() => {}
    }
}
