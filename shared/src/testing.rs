//! What tests, fuzz targets, benchmarks and automation reach into; not part of the API
//! (hidden from the docs, free to change).
//!
//! The fuzz targets check the header parsers against oracles of their own, and a cost
//! benchmark times the exact SQL the database envelope sends.

use std::time::Duration;

pub use crate::header::InvalidValue;
use crate::header::read_values;

/// gRPC's budget header.
pub const GRPC_TIMEOUT_HEADER: http::HeaderName = crate::header::GRPC_TIMEOUT_HEADER;
/// The longest budget header value looked at.
pub const MAX_VALUE_BYTES: usize = crate::header::MAX_VALUE_BYTES;
/// The most digits of a `grpc-timeout`.
pub const MAX_GRPC_DIGITS: usize = crate::header::MAX_GRPC_DIGITS;
/// Our header, as problems name it.
pub const REQUEST_TIMEOUT_HEADER_DISPLAY: &str = crate::header::REQUEST_TIMEOUT_HEADER_DISPLAY;
/// `grpc-timeout`, as problems name it.
pub const GRPC_TIMEOUT_HEADER_DISPLAY: &str = crate::header::GRPC_TIMEOUT_HEADER_DISPLAY;

/// One value of `X-Request-Timeout-Ms`.
pub fn parse_millis(raw: &[u8]) -> Result<u64, InvalidValue> {
    crate::header::parse_millis(raw)
}

/// One value of `grpc-timeout`.
pub fn parse_grpc_value(raw: &[u8]) -> Result<Duration, InvalidValue> {
    crate::header::parse_grpc_value(raw)
}

/// `X-Request-Timeout-Ms` alone, as [`read_budget`](crate::read_budget) reads it.
pub fn parse_request_timeout(
    headers: &http::HeaderMap,
) -> Result<Option<std::time::Duration>, InvalidValue> {
    let ms = read_values(headers, &crate::REQUEST_TIMEOUT_HEADER, parse_millis)?;
    Ok(ms.map(Duration::from_millis))
}

/// `grpc-timeout` alone, as [`read_budget`](crate::read_budget) reads it.
pub fn parse_grpc_timeout(
    headers: &http::HeaderMap,
) -> Result<Option<std::time::Duration>, InvalidValue> {
    read_values(headers, &GRPC_TIMEOUT_HEADER, parse_grpc_value)
}

/// The `total` of a downstream's `Server-Timing`, as the budgeted client reads it.
#[cfg(feature = "http-client")]
pub fn server_total(headers: &http::HeaderMap) -> Option<Duration> {
    crate::client::server_total(headers)
}

/// Whether a downstream's 500 body says `outcome-unknown`, as the budgeted client reads it.
#[cfg(feature = "http-client")]
pub fn is_outcome_unknown(body: &[u8]) -> bool {
    crate::client::is_outcome_unknown(body)
}

/// What the envelope asks to learn whether the schema defers work to COMMIT.
#[cfg(feature = "sqlx")]
pub const DEFERRED_WORK_QUERY: &str = crate::db::sql::DEFERRED_WORK;

/// The batch that opens a transaction, as the envelope sends it.
#[cfg(feature = "sqlx")]
pub fn begin_sql(read_only: bool, limit_ms: Option<u64>) -> String {
    use crate::db::sql::Access;
    let access = if read_only {
        Access::ReadOnly
    } else {
        Access::ReadWrite
    };
    crate::db::sql::begin_sql(access, limit_ms).into_owned()
}

/// The batch that commits, as the envelope sends it.
#[cfg(feature = "sqlx")]
pub fn commit_sql(deferred: bool, limit_ms: u64) -> String {
    crate::db::sql::commit_sql(deferred, limit_ms).into_owned()
}

/// The bounds every pooled session of [`Db`](crate::db::Db) carries with `config`, as
/// libpq's `PGOPTIONS` spells them (`-c name=value ...`), so pgbench sessions can carry
/// the same.
#[cfg(feature = "sqlx")]
pub fn session_options(config: &crate::db::DbConfig) -> String {
    config
        .session_bounds()
        .iter()
        .map(|(name, value)| format!("-c {name}={value}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How often admission lets a probe through while it refuses.
#[cfg(feature = "admission")]
pub const PROBE_INTERVAL: Duration = crate::admission::PROBE_INTERVAL;

/// A deadline `budget` from now in `mode`, as the layer makes one when `mode` is in
/// force (tests of a step's behaviour per mode, without a request around it).
pub fn deadline_in(mode: crate::DeadlineMode, budget: std::time::Duration) -> crate::Deadline {
    crate::Deadline::after(budget).with_mode(mode)
}

/// The sample `name{labels}` of a Prometheus text exposition, `labels` as the
/// exposition spells them (the crate's tests read `/metrics` with it).
pub fn metric_value(exposition: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
}
