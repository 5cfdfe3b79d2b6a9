//! Settings, from environment variables or the matching `--flags` (docs/design.md §8).

use std::net::SocketAddr;

use clap::Parser;
use service_kit::telemetry::LogFormat;

/// catalog-service settings. `--help` lists each with its variable and default.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "catalog-service",
    version,
    about = "The catalog downstream, with fault injection on an admin port"
)]
pub struct Config {
    /// Public address: GET /catalog/{sku}, /metrics, /healthz.
    #[arg(long, env = "CATALOG_LISTEN_ADDR", default_value = "127.0.0.1:8081")]
    pub listen_addr: SocketAddr,

    /// Admin address, the only place the fault API is served. Keep it on loopback.
    #[arg(long, env = "CATALOG_ADMIN_ADDR", default_value = "127.0.0.1:9081")]
    pub admin_addr: SocketAddr,

    /// Accept admin calls from non-loopback clients (compose, where k6 runs in another
    /// container). Off by default: anyone who reaches the admin API can slow the service.
    #[arg(long, env = "CATALOG_ADMIN_ALLOW_REMOTE", default_value_t = false, action = clap::ArgAction::Set)]
    pub admin_allow_remote: bool,

    /// The largest budget this service grants, whatever the caller asks for.
    #[arg(long, env = "DEADLINE_MAX_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub deadline_max_ms: u64,

    /// The budget of a request without X-Request-Timeout-Ms (clamped to the maximum).
    #[arg(long, env = "DEADLINE_DEFAULT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub deadline_default_ms: u64,

    /// A delay injected into every catalog answer from start-up.
    #[arg(long, env = "CATALOG_FAULT_DELAY_MS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=service_kit::faults::MAX_DELAY_MS))]
    pub fault_delay_ms: u64,

    /// pricing-service's gRPC address (`http://host:port`). Set, the catalog asks it for
    /// the price of every item it returns, under what is left of the request's budget;
    /// unset, the catalog prices items itself, as before.
    #[arg(long, env = "PRICING_URL")]
    pub pricing_url: Option<String>,

    /// Retry an `UNAVAILABLE` price even when the caller above retries too (it sent
    /// `X-Previous-Attempts`), as per-client retries do: off by default, on only to
    /// measure how retries compound across hops (docs/experiment.md).
    #[arg(long, env = "PRICING_RETRY_EVERY_HOP", default_value_t = false, action = clap::ArgAction::Set)]
    pub pricing_retry_every_hop: bool,

    /// Whether a request marked `X-Deadline-Mode: observe` runs in observe mode here
    /// (docs/design.md §4.3). On by default: only orders-service calls the catalog, and
    /// an observing orders-service must not meet real refusals one hop down. Turn it
    /// off where clients outside your control reach the catalog, so none of them can
    /// switch its protection off for their own requests.
    #[arg(long, env = "CATALOG_HONOUR_OBSERVE", default_value_t = true, action = clap::ArgAction::Set)]
    pub honour_observe: bool,

    /// Export the tokio runtime's metrics (`tokio_*`, docs/design.md §7); `false` only
    /// to measure what they cost.
    #[arg(long, env = "RUNTIME_METRICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub runtime_metrics: bool,

    /// Log format: readable text, or JSON lines.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Config {
    /// Settings for tests: both ports picked by the OS, defaults otherwise.
    pub fn for_tests() -> Self {
        Self::parse_from([
            "catalog-service",
            "--listen-addr=127.0.0.1:0",
            "--admin-addr=127.0.0.1:0",
        ])
    }
}
