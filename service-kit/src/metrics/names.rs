//! The names of the families the demo's services add to the library's, as the
//! exposition spells them: the process (the Prometheus process collector's names, so
//! existing dashboards and alerts apply), the tokio runtime, orders-service's mode and
//! its dependencies' health, and the catalog's injected delay. Dashboard checks read them from here beside
//! `deadline_propagation::metrics::names`.

/// Resident memory of the process (gauge).
pub const PROCESS_RESIDENT_MEMORY_BYTES: &str = "process_resident_memory_bytes";
/// CPU time of the process, user + system (counter).
pub const PROCESS_CPU_SECONDS_TOTAL: &str = "process_cpu_seconds_total";
/// Worker threads of the tokio runtime (gauge).
pub const TOKIO_WORKERS: &str = "tokio_workers";
/// Time the runtime's workers spent not parked, summed over them (counter).
pub const TOKIO_WORKER_BUSY_SECONDS_TOTAL: &str = "tokio_worker_busy_seconds_total";
/// Tasks spawned and not yet finished (gauge).
pub const TOKIO_ALIVE_TASKS: &str = "tokio_alive_tasks";
/// Tasks waiting in the runtime's shared queue for a worker (gauge).
pub const TOKIO_GLOBAL_QUEUE_DEPTH: &str = "tokio_global_queue_depth";
/// (orders) 1 for the mode in force (`legacy`, `observe`, `propagate`), by `service`
/// and `mode` (gauge).
pub const DEADLINE_MODE: &str = "deadline_mode";
/// (orders) 1 when a dependency (`database`, `catalog`) answered its last check, by
/// `service` and `dependency` (gauge).
pub const DEPENDENCY_UP: &str = "dependency_up";
/// (catalog) The injected delay now; 0 when none (gauge).
pub const CATALOG_FAULT_DELAY_SECONDS: &str = "catalog_fault_delay_seconds";

/// Every family named here.
pub const SCALARS: &[&str] = &[
    PROCESS_RESIDENT_MEMORY_BYTES,
    PROCESS_CPU_SECONDS_TOTAL,
    TOKIO_WORKERS,
    TOKIO_WORKER_BUSY_SECONDS_TOTAL,
    TOKIO_ALIVE_TASKS,
    TOKIO_GLOBAL_QUEUE_DEPTH,
    DEADLINE_MODE,
    DEPENDENCY_UP,
    CATALOG_FAULT_DELAY_SECONDS,
];

/// The name a family is written under by `encode_sample`: a counter's without the
/// `_total` that prometheus-client appends.
pub(crate) fn registered(name: &'static str) -> &'static str {
    name.strip_suffix("_total").unwrap_or(name)
}

/// Whether `series` is one of the families of a demo service: the library's, or one
/// named here.
pub fn is_series(series: &str) -> bool {
    deadline_propagation::metrics::names::is_series(series) || SCALARS.contains(&series)
}
