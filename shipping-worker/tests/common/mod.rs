//! A real orders-service on port 0 with a database of its own in the throwaway
//! PostgreSQL, shipping-worker in this process or as a child process, and the checks
//! every queue test makes against the table.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use orders_service::{Application, Config};
use reqwest::StatusCode;
use sqlx::PgPool;
use test_support::{Running, ServiceProcess};

/// The least time left for a claim, as both services are given it.
pub const MIN_USEFUL_MS: u64 = 100;

pub struct Stack {
    pub base: String,
    pub client: reqwest::Client,
    /// The test's own pool, for seeding and for reading the tables.
    pub db: PgPool,
    pub url: String,
    orders: Running,
}

/// orders-service on a fresh database (its migrations make the queue's tables), with
/// the shipments' reserve `reserve_ms`.
pub async fn orders_service(reserve_ms: u64) -> Stack {
    let database = test_support::test_database().await;
    let mut config = Config::for_tests("http://127.0.0.1:9", &database.url);
    config.shipments_reserve_ms = reserve_ms;
    config.queue_min_useful_ms = MIN_USEFUL_MS;
    let app = Application::build(config)
        .await
        .expect("orders-service builds");
    let base = format!("http://127.0.0.1:{}", app.port());
    let orders = test_support::spawn(|shutdown| app.run_until(shutdown));
    let db = PgPool::connect(&database.url).await.expect("test pool");
    Stack {
        base,
        client: reqwest::Client::new(),
        db,
        url: database.url,
        orders,
    }
}

impl Stack {
    /// `n` orders, written directly: the shipments are what is under test.
    pub async fn seed_orders(&self, n: i64) -> Vec<i64> {
        sqlx::query_scalar(
            "INSERT INTO orders (sku, quantity, unit_price_cents, total_cents)
             SELECT 'SKU-00001', 1, 100, 100 FROM generate_series(1, $1) RETURNING id",
        )
        .bind(n)
        .fetch_all(&self.db)
        .await
        .expect("seed orders")
    }

    /// `POST /api/orders/{order}/shipments` with a budget; `respond_async` adds
    /// `Prefer: respond-async`.
    pub async fn ship(
        &self,
        order: i64,
        budget_ms: u64,
        respond_async: bool,
    ) -> (StatusCode, Option<String>) {
        let mut request = self
            .client
            .post(format!("{}/api/orders/{order}/shipments", self.base))
            .header("X-Request-Timeout-Ms", budget_ms.to_string());
        if respond_async {
            request = request.header("Prefer", "respond-async");
        }
        let response = request.send().await.expect("orders-service answers");
        let location = response
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_owned());
        (response.status(), location)
    }

    /// Shipments booked for `order`.
    pub async fn shipments_of(&self, order: i64) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM shipments WHERE order_id = $1")
            .bind(order)
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    /// Waits until no job is queued or running.
    pub async fn settle(&self, within: Duration) {
        test_support::wait_until("every job is done, expired or failed", within, || async {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM queue_jobs WHERE state IN ('queued', 'running')",
            )
            .fetch_one(&self.db)
            .await
            .unwrap();
            open == 0
        })
        .await;
    }

    /// Attempts that ended (fenced, cut or done) within `ms` of their job's deadline,
    /// either side: where the caller's expire and the worker's fence meet.
    pub async fn attempts_ending_near_their_deadline(&self, ms: u64) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id
             WHERE abs(extract(epoch FROM a.ended_at - j.deadline_at)) * 1000 <= $1::float8",
        )
        .bind(ms as f64)
        .fetch_one(&self.db)
        .await
        .unwrap()
    }

    /// The queue's promises, read from its tables (never from either service): every
    /// attempt started with at least the minimum useful time left on the database's
    /// clock; at most one shipment per job, none booked at or after its deadline; a job
    /// is done exactly when its shipment exists. Returns the tally of the jobs.
    pub async fn check_the_table(&self) -> Tally {
        let late_starts: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id
             WHERE j.deadline_at IS NOT NULL
               AND a.started_at >= j.deadline_at - $1::float8 * interval '1 millisecond'",
        )
        .bind(MIN_USEFUL_MS as f64)
        .fetch_one(&self.db)
        .await
        .unwrap();
        assert_eq!(
            late_starts, 0,
            "attempts started with less than the minimum useful time left"
        );
        let twice: Vec<i64> =
            sqlx::query_scalar("SELECT job_id FROM shipments GROUP BY job_id HAVING count(*) > 1")
                .fetch_all(&self.db)
                .await
                .unwrap();
        assert!(
            twice.is_empty(),
            "jobs whose effect landed twice: {twice:?}"
        );
        let late_effects: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM shipments s JOIN queue_jobs j ON j.id = s.job_id
             WHERE s.booked_at >= j.deadline_at OR j.finished_at >= j.deadline_at",
        )
        .fetch_one(&self.db)
        .await
        .unwrap();
        assert_eq!(
            late_effects, 0,
            "effects that landed after their job's deadline"
        );
        let mismatched: Vec<(i64, String)> = sqlx::query_as(
            "SELECT j.id, j.state FROM queue_jobs j
             WHERE (j.state = 'done') <> EXISTS (SELECT 1 FROM shipments s WHERE s.job_id = j.id)",
        )
        .fetch_all(&self.db)
        .await
        .unwrap();
        assert!(
            mismatched.is_empty(),
            "jobs whose state and effect disagree: {mismatched:?}"
        );
        let tally: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state = 'done'),
                    count(*) FILTER (WHERE state = 'expired' AND attempts = 0),
                    count(*) FILTER (WHERE state = 'expired' AND attempts > 0),
                    count(*) FILTER (WHERE state = 'failed'),
                    (SELECT count(*) FROM queue_attempts WHERE outcome = 'fenced'),
                    (SELECT count(*) FROM queue_attempts WHERE outcome IS NULL)
             FROM queue_jobs",
        )
        .fetch_one(&self.db)
        .await
        .unwrap();
        Tally {
            done: tally.0,
            expired_unstarted: tally.1,
            expired_started: tally.2,
            failed: tally.3,
            fenced_attempts: tally.4,
            unended_attempts: tally.5,
        }
    }
}

/// What became of the jobs, from the table.
#[derive(Debug, Default)]
pub struct Tally {
    pub done: i64,
    /// Expired before any worker started them.
    pub expired_unstarted: i64,
    /// Expired after a worker had started them (by the caller, the fence or the
    /// statement limit).
    pub expired_started: i64,
    pub failed: i64,
    /// Attempts whose fence found the job no longer theirs or out of time.
    pub fenced_attempts: i64,
    /// Attempts that never ended (their worker was killed).
    pub unended_attempts: i64,
}

/// The worker's settings for a test: `work_ms` plus up to `jitter_ms` per booking.
pub fn worker_config(
    url: &str,
    workers: u32,
    work_ms: u64,
    jitter_ms: u64,
) -> shipping_worker::Config {
    let mut config = shipping_worker::Config::for_tests(url);
    config.workers = workers;
    config.work_ms = work_ms;
    config.work_jitter_ms = jitter_ms;
    config.min_useful_ms = MIN_USEFUL_MS;
    config.idle_poll_ms = 5;
    config.sweep_every_ms = 50;
    config
}

/// shipping-worker in this process.
pub async fn worker_in_process(config: shipping_worker::Config) -> Running {
    let app = shipping_worker::Application::build(config)
        .await
        .expect("shipping-worker builds");
    test_support::spawn(|shutdown| app.run_until(shutdown))
}

/// shipping-worker as a child process (killed when dropped), under `faketime` with
/// `offset` (`"+5s"`) when given.
pub fn worker_process(
    config: &shipping_worker::Config,
    lease_ms: u64,
    offset: Option<&str>,
) -> ServiceProcess {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_shipping-worker"));
    let mut command = match offset {
        Some(offset) => {
            let mut command = std::process::Command::new("faketime");
            command.args(["-f", offset]).arg(&binary);
            command
        }
        None => std::process::Command::new(&binary),
    };
    command
        .env("RUST_LOG", "warn")
        .env("SHIPPING_LISTEN_ADDR", "127.0.0.1:0")
        .env("DATABASE_URL", config.database_url.expose())
        .env("SHIPPING_WORKERS", config.workers.to_string())
        .env("SHIPPING_WORK_MS", config.work_ms.to_string())
        .env("SHIPPING_WORK_JITTER_MS", config.work_jitter_ms.to_string())
        .env("QUEUE_MIN_USEFUL_MS", config.min_useful_ms.to_string())
        .env("QUEUE_LEASE_MS", lease_ms.to_string())
        .env("SHIPPING_IDLE_POLL_MS", config.idle_poll_ms.to_string())
        .env("SHIPPING_SWEEP_EVERY_MS", config.sweep_every_ms.to_string());
    let log = std::env::temp_dir().join(format!("shipping-worker-{}.log", std::process::id()));
    ServiceProcess::spawn(command, log).expect("shipping-worker starts")
}
