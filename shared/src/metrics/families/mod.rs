//! The metric families, one file per group: what the deadline, the HTTP server, a
//! client, the database pool, tool calls and the configuration report, and the trace
//! exemplars of the latency histograms. Each registers under its name in
//! [`names`](super::names). The families of a part of the crate exist only where that
//! part is built (a service without the database has no `db_*` families, one that
//! neither serves nor calls has no configuration to export).

#[cfg(feature = "http-client")]
mod client;
#[cfg(feature = "sqlx")]
mod db;
mod deadline;
mod exemplar;
mod histogram;
mod http;
mod settings;
#[cfg(feature = "tools")]
mod tools;

#[cfg(feature = "http-client")]
pub(crate) use client::{ClientMetrics, ClientObserver};
#[cfg(feature = "sqlx")]
pub(crate) use db::DbMetrics;
pub(crate) use deadline::DeadlineMetrics;
use histogram::Histogram;
pub(crate) use http::HttpServerMetrics;
#[cfg(feature = "http-client")]
pub(crate) use settings::PoolLimits;
pub(crate) use settings::SettingsMetrics;
#[cfg(feature = "tools")]
pub(crate) use tools::ToolMetrics;

/// Buckets from 1 ms to 10 s, dense around the budgets this project uses (300 ms to
/// 2 s) so a p99 "within the budget" can be read off the histogram.
const LATENCY_BUCKETS: [f64; 30] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4,
    0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(&LATENCY_BUCKETS)
}
