//! Samples orders-service's gauges and memory four times a second during a load, for
//! the peaks in the summary and the lines of the chart.

use std::time::{Duration, Instant};

use deadline_propagation::metrics::names;
use serde::{Deserialize, Serialize};
use test_support::exposition::{self, Sample as Series};
use test_support::process::rss_kib;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One moment of orders-service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t: f64,
    /// Catalog calls waiting for a bulkhead slot.
    pub pending: f64,
    /// Bulkhead slots in use.
    pub active: f64,
    /// `POST /api/orders` requests being handled.
    pub in_flight: f64,
    /// Callers waiting for a PostgreSQL connection.
    pub db_pending: f64,
    /// Resident memory, MiB.
    pub rss_mib: f64,
    /// catalog-service's requests in flight: its busy slots, useful or not.
    #[serde(default)]
    pub catalog_in_flight: f64,
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
        catalog_in_flight: 0.0,
    }
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
    /// Samples orders' `metrics_url`, the catalog's in-flight gauge from
    /// `catalog_metrics_url` and the memory of process `pid` every 250 ms from now on.
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
"#;
        let sample = gauges(&exposition::parse(text), 1.5, 20.0);
        assert_eq!(
            sample,
            Sample {
                t: 1.5,
                pending: 7.0,
                active: 50.0,
                in_flight: 57.0,
                db_pending: 2.0,
                rss_mib: 20.0,
                catalog_in_flight: 0.0
            }
        );
    }
}
