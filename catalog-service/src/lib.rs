//! catalog-service: the downstream of the demo, a catalog that can be made slow on demand.
//!
//! # Module map
//!
//! - [`config`]: settings from the environment and `--flags`.
//! - [`catalog`]: the 1000 deterministic items `SKU-00001` ... `SKU-01000`.
//! - [`faults`] (service-kit's): the fault injector (delay, jitter, error rate, busy spin). It runs inside the
//!   request's deadline, so an injected 1 s delay under a 300 ms budget ends at 300 ms
//!   with a 504, and it stops as soon as the caller goes away.
//! - [`admin`]: `GET|PUT|DELETE /admin/faults`, served only on the admin address.
//! - [`pricing`]: with `PRICING_URL`, the gRPC call to pricing-service for each item's
//!   price, under what is left of the budget.
//! - [`routes`]: the public API, `GET /catalog/{sku}`.
//!
//! The service clamps budgets with its own maximum (defence in depth): a caller that
//! sends no budget, like orders-service in legacy mode, is limited only by that maximum.

pub mod admin;
pub mod catalog;
pub mod config;
pub mod pricing;
pub mod routes;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use deadline_propagation::metrics::Metrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::ConstGauge;
use service_kit::server::{ServerOptions, serve};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;
pub use service_kit::faults::{self, FaultConfig, Faults};

/// A built, bound catalog-service, not yet serving.
pub struct Application {
    public: TcpListener,
    admin: TcpListener,
    port: u16,
    admin_port: u16,
    faults: Faults,
    metrics: Metrics,
    pricing: Option<pricing::Pricing>,
    drain_timeout: Duration,
    config: Config,
}

impl Application {
    /// Binds both listeners (port 0 picks a free port, as tests do) and builds the state.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let public = bind(config.listen_addr, "CATALOG_LISTEN_ADDR").await?;
        let admin = bind(config.admin_addr, "CATALOG_ADMIN_ADDR").await?;
        let faults = Faults::new(FaultConfig {
            delay_ms: config.fault_delay_ms,
            ..FaultConfig::default()
        });
        let metrics = metrics_with_fault_delay(&faults, config.runtime_metrics);
        let pricing = match &config.pricing_url {
            Some(url) => {
                metrics.declare_downstream(pricing::downstream());
                let every_hop = config.pricing_retry_every_hop;
                let client = pricing::Pricing::new(url, every_hop);
                Some(client.with_context(|| format!("PRICING_URL={url}"))?)
            }
            None => None,
        };
        Ok(Self {
            port: public.local_addr()?.port(),
            admin_port: admin.local_addr()?.port(),
            public,
            admin,
            faults,
            metrics,
            pricing,
            drain_timeout: service_kit::server::drain_timeout(Duration::from_millis(
                config.deadline_max_ms,
            )),
            config,
        })
    }

    /// The public port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The admin port.
    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// The fault injector, shared with the admin API.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// This service's metrics.
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// Serves both ports until `shutdown` resolves, then drains in-flight requests.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let stop = CancellationToken::new();
        let trigger = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            trigger.cancel();
        });
        let options = ServerOptions {
            drain_timeout: self.drain_timeout,
            ..ServerOptions::default()
        };
        let public = routes::router(
            &self.config,
            self.faults.clone(),
            self.pricing.clone(),
            self.metrics.clone(),
        );
        let admin = admin::router(self.faults.clone(), self.config.admin_allow_remote);
        tokio::join!(
            serve(self.public, public, stop.clone().cancelled_owned(), options),
            serve(self.admin, admin, stop.cancelled_owned(), options),
        );
    }
}

/// The service's metrics, with `catalog_fault_delay_seconds`: the delay injected now,
/// read at each scrape, since the admin API changes it at any time; the dashboard marks
/// when latency was injected from it (docs/design.md §7). Jitter and error rate are not
/// exported.
fn metrics_with_fault_delay(faults: &Faults, runtime_metrics: bool) -> Metrics {
    let faults = faults.clone();
    service_kit::metrics::for_service("catalog-service", runtime_metrics, move |registry| {
        registry.register_collector(Box::new(FaultDelay(faults)));
    })
}

/// Encodes `catalog_fault_delay_seconds` from the fault injector at each scrape.
#[derive(Debug)]
struct FaultDelay(Faults);

impl Collector for FaultDelay {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let delay = Duration::from_millis(self.0.get().delay_ms).as_secs_f64();
        service_kit::metrics::encode_sample(
            &mut encoder,
            service_kit::metrics::names::CATALOG_FAULT_DELAY_SECONDS,
            "The delay injected into every catalog answer now; 0 when none",
            ConstGauge::new(delay),
        )
    }
}

async fn bind(addr: SocketAddr, variable: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({variable})"))
}
