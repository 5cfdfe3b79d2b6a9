//! The queue's metrics (docs/design.md §7): its depth and its oldest job's age, read
//! from the table; the jobs expired before they started (swept) and at the fence; the
//! claim latency, from a job's enqueue to its claim on the database's clock.

use std::time::Duration;

use deadline_propagation::metrics::Metrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Queued jobs now (gauge).
pub const QUEUE_DEPTH: &str = "queue_depth";
/// Age of the oldest queued job, 0 when none (gauge).
pub const QUEUE_OLDEST_JOB_AGE_SECONDS: &str = "queue_oldest_job_age_seconds";
/// Jobs expired, by `at`: `queue` (never started) or `fence` (their effect rolled
/// back) (counter).
pub const QUEUE_JOBS_EXPIRED_TOTAL: &str = "queue_jobs_expired_total";
/// Jobs whose effect committed (counter).
pub const QUEUE_JOBS_DONE_TOTAL: &str = "queue_jobs_done_total";
/// From a job's enqueue to its claim (histogram).
pub const QUEUE_CLAIM_LATENCY_SECONDS: &str = "queue_claim_latency_seconds";

/// The families above, by `queue`.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    depth: Family<[(&'static str, &'static str); 1], Gauge>,
    oldest: Family<[(&'static str, &'static str); 1], Gauge<f64, AtomicU64>>,
    expired: Family<[(&'static str, &'static str); 2], Counter>,
    done: Family<[(&'static str, &'static str); 1], Counter>,
    claim_latency: Family<[(&'static str, &'static str); 1], Histogram>,
    queue: &'static str,
}

impl QueueMetrics {
    fn register(registry: &mut Registry, queue: &'static str) -> Self {
        let metrics = Self {
            depth: Family::default(),
            oldest: Family::default(),
            expired: Family::default(),
            done: Family::default(),
            claim_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
            queue,
        };
        registry.register(QUEUE_DEPTH, "Queued jobs now", metrics.depth.clone());
        registry.register(
            QUEUE_OLDEST_JOB_AGE_SECONDS,
            "Age of the oldest queued job; 0 when none",
            metrics.oldest.clone(),
        );
        registry.register(
            strip_total(QUEUE_JOBS_EXPIRED_TOTAL),
            "Jobs expired: at=queue never started, at=fence their effect rolled back",
            metrics.expired.clone(),
        );
        registry.register(
            strip_total(QUEUE_JOBS_DONE_TOTAL),
            "Jobs whose effect committed",
            metrics.done.clone(),
        );
        registry.register(
            QUEUE_CLAIM_LATENCY_SECONDS,
            "From a job's enqueue to its claim, on the database's clock",
            metrics.claim_latency.clone(),
        );
        // Every series exists from the first scrape.
        for at in ["queue", "fence"] {
            drop(
                metrics
                    .expired
                    .get_or_create(&[("queue", queue), ("at", at)]),
            );
        }
        drop(metrics.done.get_or_create(&metrics.label()));
        drop(metrics.depth.get_or_create(&metrics.label()));
        drop(metrics.oldest.get_or_create(&metrics.label()));
        drop(metrics.claim_latency.get_or_create(&metrics.label()));
        metrics
    }

    /// The service's metrics with these families for `queue`.
    pub fn for_service(queue: &'static str, runtime_metrics: bool) -> (Metrics, Self) {
        let mut own = None;
        let metrics = service_kit::metrics::for_service("shipping-worker", runtime_metrics, |r| {
            own = Some(Self::register(r, queue));
        });
        (metrics, own.expect("the registry was built"))
    }

    fn label(&self) -> [(&'static str, &'static str); 1] {
        [("queue", self.queue)]
    }

    /// The backlog as the table says.
    pub fn backlog(&self, depth: u64, oldest: Duration) {
        let depth = i64::try_from(depth).unwrap_or(i64::MAX);
        self.depth.get_or_create(&self.label()).set(depth);
        self.oldest
            .get_or_create(&self.label())
            .set(oldest.as_secs_f64());
    }

    /// A job claimed after waiting `waited`.
    pub fn claimed(&self, waited: Duration) {
        self.claim_latency
            .get_or_create(&self.label())
            .observe(waited.as_secs_f64());
    }

    /// Jobs expired `at` the queue or the fence.
    pub fn expired(&self, at: &'static str, n: u64) {
        self.expired
            .get_or_create(&[("queue", self.queue), ("at", at)])
            .inc_by(n);
    }

    /// A job done.
    pub fn done(&self) {
        self.done.get_or_create(&self.label()).inc();
    }
}

/// prometheus-client appends `_total` to a counter's name.
fn strip_total(name: &'static str) -> &'static str {
    name.strip_suffix("_total").unwrap_or(name)
}
