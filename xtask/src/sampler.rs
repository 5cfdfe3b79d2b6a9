//! Everything the harness reads from the services' `/metrics`, by the names of the
//! contract (the only module that names them): orders-service's gauges and memory and
//! both services' tokio runtimes, sampled four times a second during a load for the
//! peaks in the summary, the three-way answer ([`crate::diagnosis`]) and the time series;
//! and the counters a load grows.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use deadline_propagation::metrics::names;
use serde::Serialize;
use service_kit::metrics::names as kit;
use test_support::exposition::{self, Sample as Series};
use test_support::process::rss_kib;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One moment of orders-service, `t` seconds into the load: catalog calls waiting for
/// a bulkhead slot and slots in use, `POST /api/orders` requests being handled, callers
/// waiting for a PostgreSQL connection, and resident memory (MiB).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Sample {
    pub t: f64,
    pub pending: f64,
    pub active: f64,
    pub in_flight: f64,
    pub db_pending: f64,
    pub rss_mib: f64,
    /// catalog-service's requests in flight: its busy slots, useful or not.
    pub catalog_in_flight: f64,
    /// Requests catalog-service has answered so far, by its own count.
    pub catalog_received: f64,
    /// orders-service's catalog calls so far (`http_client_requests_seconds_count`).
    pub catalog_calls: f64,
    /// Their time so far, s (`http_client_requests_seconds_sum`): pool wait excluded.
    pub catalog_call_s: f64,
    /// Each service's tokio runtime; `None` without the `tokio_*` families.
    pub orders_runtime: Option<Runtime>,
    pub catalog_runtime: Option<Runtime>,
}

/// One reading of a service's tokio runtime (docs/design.md §7): worker threads, their
/// busy time so far (s, summed), tasks alive, tasks waiting in the shared queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Runtime {
    pub workers: f64,
    pub busy_s: f64,
    pub alive_tasks: f64,
    pub global_queue: f64,
}

impl Runtime {
    /// The runtime's families in one scrape, or `None` when it has none of them.
    pub fn read(series: &[Series]) -> Option<Self> {
        let value = |name| exposition::sum(series, name, &[]);
        Some(Self {
            workers: value(kit::TOKIO_WORKERS)?,
            busy_s: value(kit::TOKIO_WORKER_BUSY_SECONDS_TOTAL)?,
            alive_tasks: value(kit::TOKIO_ALIVE_TASKS)?,
            global_queue: value(kit::TOKIO_GLOBAL_QUEUE_DEPTH)?,
        })
    }
}

/// Reads the gauges out of one scrape of `/metrics`.
pub fn gauges(series: &[Series], t: f64, rss_mib: f64) -> Sample {
    let catalog = [("client", "catalog")];
    let value =
        |name, labels: &[(&str, &str)]| exposition::sum(series, name, labels).unwrap_or(0.0);
    Sample {
        t,
        pending: value(names::HTTP_CLIENT_POOL_PENDING_ACQUIRES, &catalog),
        active: value(names::HTTP_CLIENT_POOL_ACTIVE_CONNECTIONS, &catalog),
        in_flight: value(
            names::HTTP_SERVER_REQUESTS_IN_FLIGHT,
            &[("uri", "/api/orders")],
        ),
        db_pending: value(names::DB_POOL_PENDING_ACQUIRES, &[]),
        rss_mib,
        catalog_calls: value(
            &format!("{}_count", names::HTTP_CLIENT_REQUESTS_SECONDS),
            &catalog,
        ),
        catalog_call_s: value(
            &format!("{}_sum", names::HTTP_CLIENT_REQUESTS_SECONDS),
            &catalog,
        ),
        orders_runtime: Runtime::read(series),
        ..Sample::default()
    }
}

/// The catalog bulkhead's queue limit, as orders-service exports it.
pub fn pending_limit(series: &[Series]) -> Option<f64> {
    let labels = [("client", "catalog"), ("kind", "pending_max")];
    exposition::sum(series, names::HTTP_CLIENT_POOL_LIMIT, &labels)
}

/// The hops of the chain, in order, as the counters of [`counters`] name them.
pub const HOPS: [&str; 3] = ["orders", "catalog", "pricing"];

/// How late past its deadline a hop's answer may leave and be in time (docs/design.md
/// §9): a bucket of `deadline_overrun_seconds`, so the share later than it is exact.
pub const HOP_LATE_AFTER: &str = "0.01";

/// The counters a load grows, by name, in one scrape of each service (`hops`, in
/// [`HOPS`]' order, empty for one not there): the catalog's time on calls answered 200
/// and its answers; orders-service's catalog attempts, cut ones, hedges, extra attempts
/// cut or refused, admission's refusals; each hop's answers under a deadline and those
/// later than [`HOP_LATE_AFTER`] past it.
pub fn counters(hops: [&[Series]; 3]) -> BTreeMap<String, f64> {
    let [orders, catalog, _] = hops;
    let sum = |series, family: &str, labels: &[(&str, &str)]| {
        exposition::sum(series, family, labels).unwrap_or(0.0)
    };
    let (server, client) = (names::HTTP_SERVER_REQUESTS_SECONDS, ("client", "catalog"));
    let (uri, requests) = (
        ("uri", "/catalog/{sku}"),
        format!("{}_count", names::HTTP_CLIENT_REQUESTS_SECONDS),
    );
    let status = |status| sum(orders, &requests, &[client, ("status", status)]);
    let attempts = |labels: &[(&str, &str)]| {
        sum(
            orders,
            names::HTTP_CLIENT_ATTEMPTS_TOTAL,
            &[&[client], labels].concat(),
        )
    };
    let extra = |kind, outcome| attempts(&[("kind", kind), ("outcome", outcome)]);
    let late = [client, ("reason", "predicted_late")];
    #[rustfmt::skip]
    let counters = [
        ("catalog_answer_seconds", sum(catalog, &format!("{server}_sum"), &[uri, ("status", "200")])),
        ("catalog_calls", sum(catalog, &format!("{server}_count"), &[uri])),
        ("attempts", sum(orders, &requests, &[client])),
        ("attempts_cut", status("timeout") + status("504")),
        ("hedges", extra("hedge", "won") + extra("hedge", "lost") + extra("hedge", "cut")),
        ("extra_cut", extra("hedge", "cut") + extra("retry", "cut")),
        ("extra_refused_deadline", attempts(&[("outcome", "refused_deadline")])),
        ("predicted_late", sum(orders, names::HTTP_CLIENT_ADMISSION_REJECTIONS_TOTAL, &late)),
    ];
    let mut counters: BTreeMap<String, f64> = counters.map(|(name, n)| (name.to_owned(), n)).into();
    let [received, answered, in_time] = [
        format!("{}_count", names::DEADLINE_INBOUND_BUDGET_SECONDS),
        format!("{}_count", names::DEADLINE_OVERRUN_SECONDS),
        format!("{}_bucket", names::DEADLINE_OVERRUN_SECONDS),
    ];
    for (hop, series) in HOPS.into_iter().zip(hops) {
        let answers = sum(series, &answered, &[]);
        let late = answers - sum(series, &in_time, &[("le", HOP_LATE_AFTER)]);
        counters.insert(format!("{hop}_received"), sum(series, &received, &[]));
        counters.insert(format!("{hop}_answers"), answers);
        counters.insert(format!("{hop}_late"), late);
    }
    counters
}

/// `POST /api/orders` being handled, as orders-service exports it.
pub fn orders_in_flight(series: &[Series]) -> Option<f64> {
    exposition::sum(
        series,
        names::HTTP_SERVER_REQUESTS_IN_FLIGHT,
        &[("uri", "/api/orders")],
    )
}

/// One scrape of `url`, parsed; empty when the service does not answer.
pub async fn scrape(client: &reqwest::Client, url: &str) -> Vec<Series> {
    let text = match client.get(url).timeout(Duration::from_secs(2)).send().await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    exposition::parse(&text)
}

/// The sampling task; [`Sampler::stop`] ends it and hands over the samples.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Samples both services' `/metrics` and the memory of `pid` every 250 ms.
    pub fn start(metrics_url: String, catalog_metrics_url: String, pid: u32) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let client = reqwest::Client::new();
            let started = Instant::now();
            let mut samples = Vec::new();
            loop {
                let series = scrape(&client, &metrics_url).await;
                let rss = rss_kib(pid) as f64 / 1024.0;
                let mut sample = gauges(&series, started.elapsed().as_secs_f64(), rss);
                let catalog = scrape(&client, &catalog_metrics_url).await;
                sample.catalog_in_flight = exposition::sum(
                    &catalog,
                    names::HTTP_SERVER_REQUESTS_IN_FLIGHT,
                    &[("uri", "/catalog/{sku}")],
                )
                .unwrap_or(0.0);
                sample.catalog_received = exposition::sum(
                    &catalog,
                    &format!("{}_count", names::HTTP_SERVER_REQUESTS_SECONDS),
                    &[("uri", "/catalog/{sku}")],
                )
                .unwrap_or(0.0);
                sample.catalog_runtime = Runtime::read(&catalog);
                samples.push(sample);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = stopped.changed() => return samples,
                }
            }
        });
        Self { stop, task }
    }

    /// Stops sampling; returns every sample taken.
    pub async fn stop(self) -> Vec<Sample> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_gauges_by_their_contract_labels() {
        let text = r#"http_client_pool_pending_acquires{client="catalog"} 7
http_client_pool_active_connections{client="catalog"} 50
http_server_requests_in_flight{uri="/api/orders"} 57
http_server_requests_in_flight{uri="/metrics"} 1
db_pool_pending_acquires 2
http_client_requests_seconds_count{client="catalog",status="200"} 10
http_client_requests_seconds_count{client="catalog",status="timeout"} 2
http_client_requests_seconds_sum{client="catalog",status="200"} 1.5
http_client_requests_seconds_sum{client="catalog",status="timeout"} 1.4
http_client_requests_seconds_count{client="fraud",status="200"} 99
tokio_workers 2
tokio_worker_busy_seconds_total 3.25
tokio_alive_tasks 40
tokio_global_queue_depth 3
"#;
        let s = gauges(&exposition::parse(text), 1.5, 20.0);
        let gauges = [
            s.t,
            s.pending,
            s.active,
            s.in_flight,
            s.db_pending,
            s.rss_mib,
        ];
        assert_eq!(gauges, [1.5, 7.0, 50.0, 57.0, 2.0, 20.0]);
        assert_eq!(
            [s.catalog_calls, s.catalog_call_s],
            [12.0, 2.9],
            "catalog's series only"
        );
        let runtime = Runtime {
            workers: 2.0,
            busy_s: 3.25,
            alive_tasks: 40.0,
            global_queue: 3.0,
        };
        assert_eq!((s.orders_runtime, s.catalog_runtime), (Some(runtime), None));
    }

    #[test]
    fn a_runtime_without_its_families_reads_as_none() {
        let text = "tokio_workers 2\ntokio_alive_tasks 4\n";
        assert_eq!(Runtime::read(&exposition::parse(text)), None);
        assert_eq!(Runtime::read(&[]), None);
    }
}
