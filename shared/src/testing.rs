//! What tests, fuzz targets, benchmarks and automation reach into; not part of the API
//! (hidden from the docs, free to change).
//!
//! The fuzz targets check the header parsers against oracles of their own, and a cost
//! benchmark times the exact SQL the database envelope sends.

pub use crate::header::{
    GRPC_TIMEOUT_HEADER, GRPC_TIMEOUT_HEADER_DISPLAY, InvalidValue, MAX_GRPC_DIGITS,
    MAX_VALUE_BYTES, REQUEST_TIMEOUT_HEADER_DISPLAY, parse_grpc_timeout, parse_grpc_value,
    parse_millis, parse_request_timeout,
};

#[cfg(feature = "sqlx")]
pub use crate::db::schema::QUERY as DEFERRED_WORK_QUERY;
#[cfg(feature = "sqlx")]
pub use crate::db::sql::{Access, begin_sql, commit_sql};

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
pub const PROBE_INTERVAL: std::time::Duration = crate::admission::PROBE_INTERVAL;

pub use crate::deadline::NO_RETURN_GRACE;

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
