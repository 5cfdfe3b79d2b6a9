//! The registry of a demo service: the library's families, the downstream the demo's
//! contract names, the process's memory and CPU, and the tokio runtime's workers and
//! queues ([below](self#runtime-metrics)).
//!
//! `process_resident_memory_bytes` and `process_cpu_seconds_total` are read from
//! `/proc/self` at scrape time. docs/design.md §9 asks for flat memory under load, and a
//! CPU-bound service explains latency that neither the pool nor the downstream does. The
//! names are the Prometheus process collector's, so existing dashboards and alerts apply
//! unchanged. Two small files per scrape cost microseconds and need no dependency
//! (`libc::sysconf` would need `unsafe`, which this workspace forbids). Without `/proc`
//! both are absent.
//!
//! # Runtime metrics
//!
//! `tokio_workers`, `tokio_worker_busy_seconds_total`, `tokio_alive_tasks` and
//! `tokio_global_queue_depth` are tokio's stable runtime metrics of the runtime the
//! service was built on, read at scrape time: they tell a saturated executor (workers
//! busy nearly all the time) from a pool queue or a slow downstream, which look the same
//! from outside. `RUNTIME_METRICS=false` leaves them out, to measure what they cost.

pub mod names;
mod runtime;

use deadline_propagation::Downstream;
use deadline_propagation::metrics::Metrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Clock ticks per second in `/proc/<pid>/stat`: `USER_HZ`, which the kernel fixes at
/// 100 for user space on every architecture Rust targets (what `sysconf(_SC_CLK_TCK)`
/// returns), whatever the kernel's internal `HZ`.
const USER_HZ: f64 = 100.0;

/// The metrics of a demo service named `service`, with what `register` adds to the
/// same registry (the catalog's fault gauge), and the tokio runtime's metrics when
/// `runtime_metrics` is set. Call it on the runtime that serves the service (in its
/// `Application::build`): that is the runtime whose metrics are exported.
///
/// Both services declare the catalog, the downstream of the demo's contract
/// (docs/design.md §3.5), so its stages' series exist in each from the first scrape,
/// and dashboards that sum over both services never see a series appear from nowhere.
pub fn for_service(
    service: &'static str,
    runtime_metrics: bool,
    register: impl FnOnce(&mut Registry),
) -> Metrics {
    let metrics = Metrics::with_registry(service, |registry| {
        registry.register_collector(Box::new(ProcessCollector));
        if runtime_metrics {
            registry.register_collector(Box::new(runtime::RuntimeCollector::current()));
        }
        register(registry);
    });
    metrics.declare_downstream(catalog());
    metrics
}

/// The demo's one downstream of the contract.
pub fn catalog() -> Downstream {
    Downstream::new("catalog").expect("a valid downstream name")
}

/// Encodes one unlabelled sample, read at scrape time, under `name` (a counter's name
/// without `_total`: prometheus-client appends it). What every collector here does.
pub fn encode_sample(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    sample: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, sample.metric_type())?;
    sample.encode(metric)
}

/// Encodes the process metrics on every scrape.
#[derive(Debug, Default)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let status = std::fs::read_to_string("/proc/self/status").ok();
        if let Some(bytes) = status.as_deref().and_then(resident_bytes) {
            encode_sample(
                &mut encoder,
                names::PROCESS_RESIDENT_MEMORY_BYTES,
                "Resident memory size in bytes",
                ConstGauge::new(bytes),
            )?;
        }
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        if let Some(seconds) = stat.as_deref().and_then(cpu_seconds) {
            encode_sample(
                &mut encoder,
                names::registered(names::PROCESS_CPU_SECONDS_TOTAL),
                "Total user and system CPU time spent in seconds",
                ConstCounter::new(seconds),
            )?;
        }
        Ok(())
    }
}

/// `VmRSS` of `/proc/self/status` (in kB there), in bytes.
fn resident_bytes(status: &str) -> Option<i64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut words = line.split_whitespace();
    let kib: i64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then(|| kib.saturating_mul(1024))
}

/// `utime + stime` of `/proc/self/stat` (fields 14 and 15, every thread of the
/// process), in seconds. The command name (field 2) is in parentheses and may itself
/// contain spaces and parentheses, so fields are counted from the last `)`.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime.saturating_add(stime) as f64 / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_vmrss_in_bytes() {
        let status = "Name:\tdemo\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads:\t4\n";
        assert_eq!(resident_bytes(status), Some(1234 * 1024));
        assert_eq!(resident_bytes("Name:\tdemo\n"), None);
        assert_eq!(resident_bytes("VmRSS:\t12 pages\n"), None);
    }

    #[test]
    fn cpu_time_adds_user_and_system_ticks_even_with_a_tricky_name() {
        // Fields 14 (utime) = 250 and 15 (stime) = 50 ticks: 3 s at USER_HZ = 100.
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 100";
        assert_eq!(cpu_seconds(stat), Some(3.0));
        assert_eq!(cpu_seconds("42 (short) S 1"), None);
    }

    #[test]
    fn this_process_reports_both_on_linux() {
        if cfg!(target_os = "linux") {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            assert!(resident_bytes(&status).unwrap() > 0);
            let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
            assert!(cpu_seconds(&stat).is_some());
        }
    }
}
