//! Settings, from environment variables or the matching `--flags` (docs/design.md §8).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use service_kit::secret::SecretUrl;
use service_kit::telemetry::LogFormat;

/// shipping-worker settings. `--help` lists each with its variable and default.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "shipping-worker",
    version,
    about = "Books pickups for the shipments orders-service enqueues, under each job's deadline"
)]
pub struct Config {
    /// Address of /metrics and /healthz (the worker serves no API).
    #[arg(long, env = "SHIPPING_LISTEN_ADDR", default_value = "127.0.0.1:8083")]
    pub listen_addr: SocketAddr,

    /// PostgreSQL URL: orders-service's database, which holds the queue. Its password
    /// never shows.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/orders"
    )]
    pub database_url: SecretUrl,

    /// Jobs worked on at once.
    #[arg(long, env = "SHIPPING_WORKERS", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,

    /// How long booking a pickup takes (the carrier's part, spent in the job's
    /// transaction), and up to how much more at random.
    #[arg(long, env = "SHIPPING_WORK_MS", default_value_t = 50)]
    pub work_ms: u64,

    /// Up to this much is added to each booking at random.
    #[arg(long, env = "SHIPPING_WORK_JITTER_MS", default_value_t = 0)]
    pub work_jitter_ms: u64,

    /// The least time a job must have left to be claimed.
    #[arg(long, env = "QUEUE_MIN_USEFUL_MS", default_value_t = 100)]
    pub min_useful_ms: u64,

    /// How long a claim holds a job before it is taken as abandoned; also the longest
    /// any attempt runs.
    #[arg(long, env = "QUEUE_LEASE_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_ms: u64,

    /// Attempts before a job whose work keeps failing is given up as `failed`.
    #[arg(long, env = "QUEUE_MAX_ATTEMPTS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,

    /// How long an idle worker waits before it looks for a job again, if no notice of a
    /// new job wakes it first (`LISTEN`: see `wake`).
    #[arg(long, env = "SHIPPING_IDLE_POLL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_poll_ms: u64,

    /// How often jobs no worker will start are expired, and the backlog gauges read.
    #[arg(long, env = "SHIPPING_SWEEP_EVERY_MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_every_ms: u64,

    /// Export the tokio runtime's metrics (`tokio_*`).
    #[arg(long, env = "RUNTIME_METRICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub runtime_metrics: bool,

    /// Log format: readable text, or JSON lines.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Config {
    /// Settings for tests: port 0, the database given.
    pub fn for_tests(database_url: &str) -> Self {
        Self::parse_from([
            "shipping-worker",
            "--listen-addr=127.0.0.1:0",
            &format!("--database-url={database_url}"),
        ])
    }

    /// Milliseconds as a duration.
    pub fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }
}
