//! Settings, from environment variables or the matching `--flags` (docs/design.md §8).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use deadline_propagation::hedging::HedgePolicy;
use deadline_propagation::retry_budget::RetryBudget;
use service_kit::secret::{Secret, SecretUrl};
use service_kit::telemetry::LogFormat;

use deadline_propagation::Downstream;
use serde::{Deserialize, Serialize};

/// orders-service settings. `--help` lists each with its variable and default.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "orders-service",
    version,
    about = "Orders API with end-to-end deadline propagation"
)]
pub struct Config {
    /// Listen address for the API, /metrics, /healthz and /readyz.
    #[arg(long, env = "ORDERS_LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub listen_addr: SocketAddr,

    /// Base URL of catalog-service.
    #[arg(long, env = "CATALOG_URL", default_value = "http://127.0.0.1:8081")]
    pub catalog_url: String,

    /// PostgreSQL URL. Migrations run at start-up. Its password never shows: not in
    /// `--help`, not in `Debug`.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/orders"
    )]
    pub database_url: SecretUrl,

    /// The largest budget granted, whatever the client asks for.
    #[arg(long, env = "DEADLINE_MAX_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub deadline_max_ms: u64,

    /// The budget of a request without X-Request-Timeout-Ms.
    #[arg(long, env = "DEADLINE_DEFAULT_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub deadline_default_ms: u64,

    /// Budget kept back at this hop when propagating it downstream.
    #[arg(long, env = "DEADLINE_RESERVE_MS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub deadline_reserve_ms: u64,

    /// Budget kept back from a shipment job whose caller waits: the time to expire the
    /// job and answer before the request's deadline.
    #[arg(long, env = "SHIPMENTS_RESERVE_MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(20..=10_000))]
    pub shipments_reserve_ms: u64,

    /// The least time a job must have left to be claimed; a shipment with less is
    /// refused (504) before it is queued. Give shipping-worker the same.
    #[arg(long, env = "QUEUE_MIN_USEFUL_MS", default_value_t = 100)]
    pub queue_min_useful_ms: u64,

    /// How soon a waiting request first reads its job's state again; the pause doubles
    /// after each read, up to eight times this.
    #[arg(long, env = "QUEUE_POLL_MS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub queue_poll_ms: u64,

    /// `propagate` (the technique), `observe` (everything runs, nothing is refused: what
    /// propagate would refuse is counted) or `legacy` (the "before": fixed 30 s
    /// timeouts, unbounded pool wait, no statement timeout). Switchable at run time
    /// through the admin API.
    #[arg(long, env = "DEADLINE_MODE", value_enum, default_value_t = Mode::Propagate)]
    pub deadline_mode: Mode,

    /// `predict`: refuse (503) a catalog call that the recent catalog latency says
    /// cannot finish in its remaining budget, before it takes a slot. `off`: send all.
    #[arg(long, env = "CATALOG_ADMISSION", value_enum, default_value_t = Admission::Predict)]
    pub catalog_admission: Admission,

    /// Listen address of the admin API (`GET|PUT /admin/mode`). Keep it on loopback.
    #[arg(long, env = "ORDERS_ADMIN_ADDR", default_value = "127.0.0.1:9080")]
    pub admin_addr: SocketAddr,

    /// Serve the admin API to non-loopback clients too (behind a trusted network only).
    #[arg(long, env = "ORDERS_ADMIN_ALLOW_REMOTE", default_value_t = false,
          action = clap::ArgAction::Set)]
    pub admin_allow_remote: bool,

    /// Catalog calls in flight at most.
    #[arg(long, env = "CATALOG_POOL_MAX_CONNECTIONS", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub catalog_pool_max_connections: u64,

    /// Catalog calls waiting for a connection at most; more are refused with 503.
    #[arg(long, env = "CATALOG_POOL_PENDING_MAX", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub catalog_pool_pending_max: u64,

    /// The longest a catalog call waits for a connection (the early-rejection threshold).
    #[arg(long, env = "CATALOG_POOL_ACQUIRE_TIMEOUT_MS", default_value_t = 40,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub catalog_pool_acquire_timeout_ms: u64,

    /// How long an unused catalog connection is kept for reuse. Keep it well below the
    /// catalog's idle close (its 5 s header read timeout): a connection reused just as
    /// the catalog closes it loses the request, and the order fails with 502.
    #[arg(long, env = "CATALOG_POOL_IDLE_TIMEOUT_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub catalog_pool_idle_timeout_ms: u64,

    /// `on`: hedge catalog calls: a first call slower than the catalog's recent p(100 −
    /// 100 × CATALOG_HEDGE_MAX_EXTRA_LOAD) gets a backup, if what is left covers what
    /// nine calls in ten take, a slot is free and the retry budget has a token. Off by
    /// default (docs/operating.md, hedging).
    #[arg(long, env = "CATALOG_HEDGE", value_enum, default_value_t = Switch::Off)]
    pub catalog_hedge: Switch,

    /// The share of extra catalog calls hedging may add: the hedge's delay is the
    /// latency quantile 1 − this.
    #[arg(long, env = "CATALOG_HEDGE_MAX_EXTRA_LOAD", default_value_t = 0.01,
          value_parser = share_of_calls)]
    pub catalog_hedge_max_extra_load: f64,

    /// `false` sends a hedge or a retry even when what is left cannot cover what nine
    /// calls in ten take (only to measure what the rule is worth).
    #[arg(long, env = "CATALOG_HEDGE_DEADLINE_AWARE", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub catalog_hedge_deadline_aware: bool,

    /// Extra catalog calls (hedges and retries) at most, as a share of first calls.
    #[arg(long, env = "CATALOG_RETRY_BUDGET_RATIO", default_value_t = 0.03,
          value_parser = share_of_calls)]
    pub catalog_retry_budget_ratio: f64,

    /// Extra catalog calls allowed per second whatever the traffic.
    #[arg(long, env = "CATALOG_RETRY_BUDGET_PER_S", default_value_t = 0.5,
          value_parser = per_second)]
    pub catalog_retry_budget_per_s: f64,

    /// Extra downstreams each order must pass before it is written, as `name=url`
    /// (repeat the flag, or separate with commas in the variable): orders POSTs
    /// `{"sku","quantity"}` to each URL under the remaining budget; 2xx passes, 409 and
    /// 422 are passed to the client, a 504 is 504 stage `name`. Each gets a client of its
    /// own with the catalog's pool settings. Names: `[a-z][a-z0-9_]*`, not `catalog`, a
    /// fixed stage or ending in `_pool`. Default: none.
    #[arg(long = "precheck", env = "ORDERS_PRECHECKS", value_delimiter = ',', value_name = "NAME=URL",
          value_parser = parse_spec)]
    pub prechecks: Vec<PrecheckSpec>,

    /// PostgreSQL pool size.
    #[arg(long, env = "DB_POOL_MAX_CONNECTIONS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub db_pool_max_connections: u32,

    /// The longest a request waits for a database connection; then 503 `db_pool`.
    #[arg(long, env = "DB_POOL_ACQUIRE_TIMEOUT_MS", default_value_t = 250,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub db_pool_acquire_timeout_ms: u64,

    /// How long PostgreSQL lets a transaction wait for the service's next statement
    /// before it ends the session (`idle_in_transaction_session_timeout`, set on every
    /// session at connect): what ends a transaction the network has cut off. 0: off.
    #[arg(long, env = "DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub db_idle_in_transaction_timeout_ms: u64,

    /// How long PostgreSQL waits on a silent TCP connection to the service before it
    /// closes the session (`tcp_user_timeout`, keepalives every second,
    /// `client_connection_check_interval`). 0: off.
    #[arg(long, env = "DB_LIVENESS_TIMEOUT_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub db_liveness_timeout_ms: u64,

    /// The time budget of one assistant turn (never more than the request's own).
    #[arg(long, env = "ASSISTANT_TURN_BUDGET_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub assistant_turn_budget_ms: u64,

    /// The most one tool call may take (of what is left of the turn).
    #[arg(long, env = "ASSISTANT_TOOL_BUDGET_MS", default_value_t = 800,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub assistant_tool_budget_ms: u64,

    /// Tool calls per assistant turn at most; further calls are refused without running.
    #[arg(long, env = "ASSISTANT_MAX_TOOL_CALLS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub assistant_max_tool_calls: u32,

    /// An OpenAI-compatible API (e.g. `https://api.openai.com/v1`) to plan tool calls.
    /// Unset: the rule-based planner.
    #[arg(long, env = "ASSISTANT_LLM_URL")]
    pub assistant_llm_url: Option<String>,

    /// The model the OpenAI-compatible planner asks.
    #[arg(long, env = "ASSISTANT_LLM_MODEL", default_value = "gpt-4o-mini")]
    pub assistant_llm_model: String,

    /// Bearer token for the planner API (never shown: not in `--help`, not in `Debug`).
    #[arg(long, env = "ASSISTANT_LLM_API_KEY", hide_env_values = true)]
    pub assistant_llm_api_key: Option<Secret>,

    /// Host names the MCP endpoint answers to (DNS-rebinding protection), comma separated.
    #[arg(
        long,
        env = "MCP_ALLOWED_HOSTS",
        value_delimiter = ',',
        default_value = "localhost,127.0.0.1,::1,orders"
    )]
    pub mcp_allowed_hosts: Vec<String>,

    /// Browser origins `/mcp` answers, comma separated: `scheme://host:port`, `:*` for
    /// any port, or `null`. A request with any other `Origin` is 403; one without
    /// `Origin` (not sent by a browser) is served.
    #[arg(
        long,
        env = "MCP_ALLOWED_ORIGINS",
        value_delimiter = ',',
        value_parser = parse_origin,
        default_value = "http://localhost:*,http://127.0.0.1:*,http://[::1]:*"
    )]
    pub mcp_allowed_origins: Vec<String>,

    /// How long a client may take to send its request headers before it is dropped.
    #[arg(long, env = "HEADER_READ_TIMEOUT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub header_read_timeout_ms: u64,

    /// How often PostgreSQL and the catalog are checked for the `dependency_up` gauges;
    /// 0: never (`/health/dependencies` still asks them when called). Readiness does
    /// not follow them either way.
    #[arg(long, env = "DEPENDENCY_CHECK_EVERY_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub dependency_check_every_ms: u64,

    /// The longest body read from the catalog or a check; a longer one is a 502 and its
    /// connection is closed (what a downstream sends is input, bounded like a client's).
    #[arg(long, env = "DOWNSTREAM_MAX_BODY_BYTES", default_value_t = 1 << 20,
          value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub downstream_max_body_bytes: u64,

    /// Name every stage in `Server-Timing` (the downstreams, the database's time);
    /// `false` says only `total`, for an edge that faces the public (docs/operating.md).
    #[arg(long, env = "SERVER_TIMING_STAGES", default_value_t = true, action = clap::ArgAction::Set)]
    pub server_timing_stages: bool,

    /// Export the tokio runtime's metrics (`tokio_*`, docs/design.md §7); `false` only
    /// to measure what they cost.
    #[arg(long, env = "RUNTIME_METRICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub runtime_metrics: bool,

    /// Log format: readable text, or JSON lines.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `CATALOG_ADMISSION`: whether the catalog's client refuses calls predicted to finish
/// late.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Admission {
    /// Refuse calls predicted to finish late (503 before they take a slot).
    Predict,
    /// Admit every call (the pool limits still apply).
    Off,
}

/// `on` or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// A share of calls, 0.0 to 1.0.
fn share_of_calls(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("{value:?} is not a share from 0.0 to 1.0")),
    }
}

/// A rate per second, 0 to 1000.
fn per_second(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(rate) if (0.0..=1000.0).contains(&rate) => Ok(rate),
        _ => Err(format!("{value:?} is not a rate from 0 to 1000 a second")),
    }
}

/// Reads one allowed origin (clap's value parser for `MCP_ALLOWED_ORIGINS`): `null`, or
/// `scheme://host` and a port, `:*` meaning any. The port must be given: an origin
/// without one stands for its scheme's default port, and an entry that is unclear about
/// it would be read differently by different versions of the MCP library.
pub fn parse_origin(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value == "null" {
        return Ok(value.to_owned());
    }
    let bad = || {
        format!("{value:?} is not an origin like https://app.example.com:443 or http://localhost:*")
    };
    let (base, any_port) = match value.strip_suffix(":*") {
        Some(base) => (base, true),
        None => (value, false),
    };
    let uri: http::Uri = base.parse().map_err(|_| bad())?;
    let authority = uri.authority().ok_or_else(bad)?;
    let only_an_origin = uri.scheme().is_some()
        && !authority.as_str().contains('@')
        && base.ends_with(authority.as_str());
    if !only_an_origin || any_port == authority.port().is_some() {
        return Err(bad());
    }
    Ok(value.to_owned())
}

impl Config {
    /// Settings for tests: port 0, the given catalog and database, and no background
    /// check of the dependencies (tests count the calls and statements they cause).
    pub fn for_tests(catalog_url: &str, database_url: &str) -> Self {
        Self::parse_from([
            "orders-service",
            "--listen-addr=127.0.0.1:0",
            "--admin-addr=127.0.0.1:0",
            "--dependency-check-every-ms=0",
            &format!("--catalog-url={catalog_url}"),
            &format!("--database-url={database_url}"),
        ])
    }

    /// The catalog's hedge policy, if hedging is on.
    pub(crate) fn catalog_hedge(&self) -> Option<HedgePolicy> {
        (self.catalog_hedge == Switch::On).then(|| {
            let mut hedge = HedgePolicy::default();
            hedge.max_extra_load = self.catalog_hedge_max_extra_load;
            hedge.deadline_aware = self.catalog_hedge_deadline_aware;
            hedge
        })
    }

    /// The retry budget of every downstream's client.
    pub(crate) fn retry_budget(&self) -> RetryBudget {
        let mut budget = RetryBudget::default();
        budget.ratio = self.catalog_retry_budget_ratio;
        budget.floor_per_s = self.catalog_retry_budget_per_s;
        budget
    }

    pub(crate) fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }
}

/// The service's mode, as settings, the admin API and the metric label spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The service without the technique: no budget, a fixed 30 s HTTP timeout that
    /// does not cover the pool wait, no queue limit, no `statement_timeout`.
    Legacy,
    /// Everything runs, nothing is refused: what propagate would refuse is counted.
    Observe,
    /// The technique.
    Propagate,
}

impl Mode {
    /// Every mode, for the gauge.
    pub const ALL: [Mode; 3] = [Mode::Legacy, Mode::Observe, Mode::Propagate];

    /// The name in settings, the admin API and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::Observe => "observe",
            Mode::Propagate => "propagate",
        }
    }
}

/// One configured check, as `--precheck name=url` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrecheckSpec {
    /// Its name: the `client` label and the stages `{name}`, `{name}_pool`.
    pub name: Downstream,
    /// Scheme, host and port, e.g. `http://127.0.0.1:8083`.
    pub base_url: String,
    /// Path and query, e.g. `/check`.
    pub path: String,
}

/// Reads `name=url` (clap's value parser for `ORDERS_PRECHECKS` / `--precheck`). The
/// name follows [`Downstream::new`]'s rules and may not be `catalog`; the URL is an
/// absolute `http` or `https` URL without credentials.
pub fn parse_spec(value: &str) -> Result<PrecheckSpec, String> {
    let (name, url) = value.split_once('=').ok_or_else(|| {
        format!("{value:?} is not name=url (like fraud=http://127.0.0.1:8083/check)")
    })?;
    let name = Downstream::new(name.trim()).map_err(|err| err.to_string())?;
    if name == service_kit::metrics::catalog() {
        return Err("the name catalog is taken by the catalog client".to_owned());
    }
    let url = reqwest::Url::parse(url.trim()).map_err(|err| format!("{url:?}: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
        return Err(format!("{url}: use an http:// or https:// URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() || url.fragment().is_some() {
        return Err(format!(
            "{url}: credentials and fragments are not supported"
        ));
    }
    let base_url = url.origin().ascii_serialization();
    let path = url
        .as_str()
        .strip_prefix(&base_url)
        .ok_or_else(|| format!("{url}: cannot split into origin and path"))?
        .to_owned();
    Ok(PrecheckSpec {
        name,
        base_url,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_origins_need_a_scheme_a_host_and_a_port() {
        for good in [
            "https://app.example.com:443",
            "http://localhost:*",
            "http://[::1]:8080",
            "null",
        ] {
            assert_eq!(parse_origin(good).as_deref(), Ok(good));
        }
        for bad in [
            "app.example.com:443",
            "https://app.example.com",
            "https://app.example.com:443/",
            "https://app.example.com:443/path",
            "https://user@app.example.com:443",
            "https://app.example.com:443:*",
            "*",
            "",
        ] {
            assert!(parse_origin(bad).is_err(), "{bad:?} accepted");
        }
        let err = Config::try_parse_from([
            "orders-service",
            "--mcp-allowed-origins=https://ok.example.com:443,https://bad.example.com",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("bad.example.com"), "{err}");
    }
}
