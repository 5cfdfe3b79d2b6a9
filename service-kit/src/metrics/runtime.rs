//! tokio's runtime metrics, read at scrape time: the third answer beside the pool
//! queue and the slow downstream (docs/design.md §7, docs/operating.md).
//!
//! Latency up and requests in flight up look the same whether calls wait for a pool
//! slot, wait for a slow downstream, or wait for a worker thread that a CPU-bound
//! handler or a blocking call holds. Only the runtime can tell the last one: its
//! workers are busy (not parked) nearly all the time, and woken tasks wait in its
//! queues. The four families use tokio's stable `RuntimeMetrics` only (no
//! `tokio_unstable`):
//!
//! - `tokio_workers`: worker threads;
//! - `tokio_worker_busy_seconds_total`: time the workers spent not parked, summed over
//!   them, so `rate(...) / tokio_workers` is the share of worker time spent busy;
//! - `tokio_alive_tasks`: tasks spawned and not yet finished;
//! - `tokio_global_queue_depth`: tasks waiting in the shared queue for a worker, those
//!   spawned or woken from outside the workers (a task woken by I/O on a worker waits
//!   in that worker's own queue, whose depth is not a stable metric).
//!
//! tokio keeps these counters whether or not anyone reads them (each worker adds its
//! busy time when it parks, and every few dozen polls while it does not), so exporting
//! them costs a few atomic loads per scrape and nothing per request.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::runtime::{Handle, RuntimeMetrics};

use super::{encode_sample, names};

/// Encodes the runtime metrics of one runtime on every scrape.
#[derive(Debug)]
pub(super) struct RuntimeCollector {
    /// The runtime the service was built on; `None` when it was built outside one, and
    /// then the runtime that serves the scrape, if any.
    handle: Option<Handle>,
}

impl RuntimeCollector {
    /// The collector of the runtime current now, if any.
    pub(super) fn current() -> Self {
        Self {
            handle: Handle::try_current().ok(),
        }
    }
}

/// One reading of the runtime.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading {
    workers: usize,
    busy: Duration,
    alive_tasks: usize,
    global_queue_depth: usize,
}

impl Reading {
    fn of(metrics: &RuntimeMetrics) -> Self {
        let workers = metrics.num_workers();
        Self {
            workers,
            busy: (0..workers)
                .map(|w| metrics.worker_total_busy_duration(w))
                .sum(),
            alive_tasks: metrics.num_alive_tasks(),
            global_queue_depth: metrics.global_queue_depth(),
        }
    }
}

impl Collector for RuntimeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(handle) = self.handle.clone().or_else(|| Handle::try_current().ok()) else {
            return Ok(());
        };
        let reading = Reading::of(&handle.metrics());
        let gauges = [
            (
                names::TOKIO_WORKERS,
                "Worker threads of the tokio runtime",
                reading.workers,
            ),
            (
                names::TOKIO_ALIVE_TASKS,
                "Tasks spawned on the runtime and not yet finished",
                reading.alive_tasks,
            ),
            (
                names::TOKIO_GLOBAL_QUEUE_DEPTH,
                "Tasks woken and waiting in the runtime's shared queue for a worker",
                reading.global_queue_depth,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            encode_sample(&mut encoder, name, help, gauge)?;
        }
        encode_sample(
            &mut encoder,
            names::registered(names::TOKIO_WORKER_BUSY_SECONDS_TOTAL),
            "Time the runtime's workers spent not parked, summed over the workers",
            ConstCounter::new(reading.busy.as_secs_f64()),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Instant;

    use super::*;
    use crate::metrics::for_service;

    fn value(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }

    fn runtime(workers: usize) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Renders until `holds` is true of the text, for at most 5 s.
    fn render_until(
        metrics: &deadline_propagation::metrics::Metrics,
        what: &str,
        holds: impl Fn(&str) -> bool,
    ) -> String {
        let started = Instant::now();
        loop {
            let text = metrics.render();
            if holds(&text) {
                return text;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "never {what}:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn workers_and_busy_time_follow_a_spinning_task() {
        let rt = runtime(2);
        let metrics = rt.block_on(async { for_service("test", true, |_| {}) });
        let text = metrics.render();
        assert_eq!(value(&text, "tokio_workers"), 2.0, "{text}");
        let before = value(&text, "tokio_worker_busy_seconds_total");
        // 200 ms on a worker thread that never yields: all of it is busy time.
        rt.block_on(async {
            tokio::spawn(async {
                let until = Instant::now() + Duration::from_millis(200);
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            })
            .await
            .unwrap();
        });
        // A worker adds its busy time when it parks, right after the task.
        render_until(&metrics, "200 ms more busy time", |text| {
            value(text, "tokio_worker_busy_seconds_total") - before >= 0.2
        });
    }

    #[test]
    fn alive_tasks_and_the_global_queue_count_waiting_work() {
        let rt = runtime(1);
        let metrics = rt.block_on(async { for_service("test", true, |_| {}) });
        let idle = value(&metrics.render(), "tokio_alive_tasks");
        // Hold the only worker in a blocking wait, then spawn from outside the runtime:
        // those tasks can only wait in the global queue.
        let (release, held) = mpsc::channel::<()>();
        let (entered, worker_held) = mpsc::channel::<()>();
        let blocker = rt.spawn(async move {
            entered.send(()).unwrap();
            held.recv().unwrap();
        });
        worker_held.recv().unwrap();
        let waiting: Vec<_> = (0..5).map(|_| rt.spawn(async {})).collect();
        let text = metrics.render();
        assert_eq!(value(&text, "tokio_global_queue_depth"), 5.0, "{text}");
        assert_eq!(value(&text, "tokio_alive_tasks"), idle + 6.0, "{text}");
        release.send(()).unwrap();
        rt.block_on(async {
            blocker.await.unwrap();
            for task in waiting {
                task.await.unwrap();
            }
        });
        let text = render_until(&metrics, "the tasks end", |text| {
            value(text, "tokio_alive_tasks") == idle
        });
        assert_eq!(value(&text, "tokio_global_queue_depth"), 0.0, "{text}");
    }

    #[test]
    fn switched_off_or_outside_a_runtime_there_is_no_tokio_family() {
        let rt = runtime(1);
        let off = rt.block_on(async { for_service("test", false, |_| {}) });
        assert!(!off.render().contains("tokio_"), "{}", off.render());
        // Built and scraped outside any runtime: nothing to read.
        let outside = for_service("test", true, |_| {});
        assert!(!outside.render().contains("tokio_"));
        // Built outside, scraped inside one: that runtime's.
        let text = rt.block_on(async { outside.render() });
        assert_eq!(value(&text, "tokio_workers"), 1.0, "{text}");
    }
}
