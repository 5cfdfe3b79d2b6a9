//! Settings, from environment variables or the matching `--flags` (docs/design.md §8).

use std::net::SocketAddr;

use clap::Parser;
use service_kit::telemetry::LogFormat;

/// pricing-service settings. `--help` lists each with its variable and default.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "pricing-service",
    version,
    about = "The pricing hop over gRPC, with fault injection on an admin port"
)]
pub struct Config {
    /// gRPC address: `pricing.v1.Pricing` (`Price`, `WatchPrice`, `PriceBasket`).
    #[arg(long, env = "PRICING_LISTEN_ADDR", default_value = "127.0.0.1:50051")]
    pub listen_addr: SocketAddr,

    /// Admin address (HTTP): `GET|PUT|DELETE /admin/faults` and `GET /metrics`.
    #[arg(long, env = "PRICING_ADMIN_ADDR", default_value = "127.0.0.1:9082")]
    pub admin_addr: SocketAddr,

    /// Accept admin calls from non-loopback clients (compose). Off by default: anyone
    /// who reaches the admin API can slow the service.
    #[arg(long, env = "PRICING_ADMIN_ALLOW_REMOTE", default_value_t = false, action = clap::ArgAction::Set)]
    pub admin_allow_remote: bool,

    /// The largest budget this service grants, whatever `grpc-timeout` asks for.
    #[arg(long, env = "DEADLINE_MAX_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub deadline_max_ms: u64,

    /// The budget of a call without `grpc-timeout` (clamped to the maximum).
    #[arg(long, env = "DEADLINE_DEFAULT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub deadline_default_ms: u64,

    /// Run a call marked `x-deadline-mode: observe` in observe mode (no refusal for its
    /// budget, counted instead). Off by default: a caller that may send the marker
    /// switches this service's clamp off for its calls; turn it on where only the
    /// operator's own services call (the demo's catalog does, §4.3).
    #[arg(long, env = "PRICING_HONOUR_OBSERVE", default_value_t = false, action = clap::ArgAction::Set)]
    pub honour_observe: bool,

    /// Export the tokio runtime's metrics (`tokio_*`).
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
            "pricing-service",
            "--listen-addr=127.0.0.1:0",
            "--admin-addr=127.0.0.1:0",
        ])
    }
}
