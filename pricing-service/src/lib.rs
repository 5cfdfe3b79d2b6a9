//! pricing-service: the third hop of the demo, a gRPC service (tonic) that catalog-service
//! asks for the price of each item it returns.
//!
//! # Module map
//!
//! - [`config`]: settings from the environment and `--flags`.
//! - [`proto`]: the messages and service of `proto/pricing.proto` (generated, committed).
//! - [`metrics`]: `grpc_server_handled_total` and `grpc_server_handling_seconds`, and the
//!   pricing work started and completed.
//!
//! What the technique adds is one line in [`Application::run_until`]: the crate's
//! [`GrpcServerLayer`] makes each call's deadline from the caller's `grpc-timeout`
//! (clamped by this service's policy), answers `DEADLINE_EXCEEDED` there and drops the
//! handler's work; a server stream (`WatchPrice`) ends there too. The handlers name no
//! timeout. Faults (delay, jitter, error
//! rate answered `UNAVAILABLE`) come from service-kit's injector, on the admin port.

pub mod config;
pub mod metrics;
pub mod proto;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context as _;
use deadline_propagation::DeadlinePolicy;
use deadline_propagation::grpc::GrpcServerLayer;
use deadline_propagation::metrics::Metrics;
use futures_util::Stream;
use service_kit::faults::Faults;
use service_kit::server::{ServerOptions, serve};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

pub use config::Config;
use metrics::GrpcMetrics;
use proto::pricing_server::{Pricing, PricingServer};
use proto::{BasketReply, PriceReply, PriceRequest, WatchRequest};

/// A built, bound pricing-service, not yet serving.
pub struct Application {
    grpc: TcpListener,
    admin: TcpListener,
    port: u16,
    admin_port: u16,
    faults: Faults,
    metrics: Metrics,
    grpc_metrics: GrpcMetrics,
    config: Config,
}

impl Application {
    /// Binds both listeners (port 0 picks a free port, as tests do).
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let grpc = bind(config.listen_addr, "PRICING_LISTEN_ADDR").await?;
        let admin = bind(config.admin_addr, "PRICING_ADMIN_ADDR").await?;
        let mut grpc_metrics = None;
        let metrics =
            service_kit::metrics::for_service("pricing-service", config.runtime_metrics, |r| {
                grpc_metrics = Some(GrpcMetrics::register(r));
            });
        Ok(Self {
            port: grpc.local_addr()?.port(),
            admin_port: admin.local_addr()?.port(),
            grpc,
            admin,
            faults: Faults::default(),
            metrics,
            grpc_metrics: grpc_metrics.expect("registered above"),
            config,
        })
    }

    /// The gRPC port.
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

    /// Serves both ports until `shutdown` resolves.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let stop = CancellationToken::new();
        let trigger = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            trigger.cancel();
        });
        let policy = DeadlinePolicy::from_millis(
            self.config.deadline_max_ms,
            self.config.deadline_default_ms,
        );
        let pricing = PricingServer::new(PricingService {
            faults: self.faults.clone(),
            metrics: self.grpc_metrics.clone(),
        });
        let layers = tower::ServiceBuilder::new()
            // Outside the deadline, so that its DEADLINE_EXCEEDED answers are counted.
            .layer(self.grpc_metrics.clone())
            // The technique: the caller's grpc-timeout becomes this call's deadline.
            .layer(
                GrpcServerLayer::new(policy)
                    .honour_mode_header(self.config.honour_observe)
                    .with_metrics(&self.metrics),
            )
            .into_inner();
        let grpc = tonic::transport::Server::builder()
            .layer(layers)
            .add_service(pricing)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(self.grpc),
                stop.clone().cancelled_owned(),
            );
        let admin = admin_router(
            self.faults.clone(),
            self.metrics.clone(),
            self.config.admin_allow_remote,
        );
        let options = ServerOptions {
            drain_timeout: Duration::from_millis(self.config.deadline_max_ms),
            ..ServerOptions::default()
        };
        let (served, ()) = tokio::join!(
            grpc,
            serve(self.admin, admin, stop.cancelled_owned(), options)
        );
        if let Err(error) = served {
            tracing::error!(%error, "the gRPC server stopped");
        }
    }
}

/// `GET|PUT|DELETE /admin/faults` and `GET /metrics` (the crate's scrape endpoint, as
/// `measure` serves it), loopback only unless allowed.
fn admin_router(faults: Faults, metrics: Metrics, allow_remote: bool) -> axum::Router {
    let router = deadline_propagation::measure(service_kit::faults::routes(faults), &metrics);
    service_kit::admin::guard(router, allow_remote, "PRICING_ADMIN_ALLOW_REMOTE")
}

/// The handlers: the faults, then the list price back. They name no timeout: the
/// server layer drops their futures (and a server stream) at the caller's deadline.
struct PricingService {
    faults: Faults,
    metrics: GrpcMetrics,
}

impl PricingService {
    /// Every injected failure (error rate, refusal) is what a gRPC service answers when
    /// it cannot serve now: UNAVAILABLE, the one code a caller may retry.
    async fn faults(&self) -> Result<(), Status> {
        match self.faults.inject().await {
            Ok(()) => Ok(()),
            Err(_) => Err(Status::unavailable("an injected fault (admin API)")),
        }
    }
}

/// The most prices one watch sends, and the longest time between two.
const WATCH_MAX_COUNT: u32 = 1_000;
const WATCH_MAX_EVERY_MS: u32 = 60_000;

#[tonic::async_trait]
impl Pricing for PricingService {
    async fn price(&self, request: Request<PriceRequest>) -> Result<Response<PriceReply>, Status> {
        self.metrics.work_started.inc();
        let request = request.into_inner();
        self.faults().await?;
        self.metrics.work_completed.inc();
        Ok(Response::new(PriceReply {
            price_cents: request.list_price_cents,
        }))
    }

    type WatchPriceStream = Pin<Box<dyn Stream<Item = Result<PriceReply, Status>> + Send>>;

    async fn watch_price(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchPriceStream>, Status> {
        let WatchRequest {
            item,
            count,
            every_ms,
        } = request.into_inner();
        let item = item.ok_or_else(|| Status::invalid_argument("item is required"))?;
        if count > WATCH_MAX_COUNT || every_ms > WATCH_MAX_EVERY_MS {
            let limits = format!("count <= {WATCH_MAX_COUNT}, every_ms <= {WATCH_MAX_EVERY_MS}");
            return Err(Status::invalid_argument(limits));
        }
        self.metrics.work_started.inc();
        self.faults().await?;
        let every = Duration::from_millis(every_ms.into());
        let price_cents = item.list_price_cents;
        let completed = self.metrics.work_completed.clone();
        // The first price at once, the next ones `every` apart; the work is complete
        // when the last was sent, so a watch cut at its deadline never completes.
        let prices = futures_util::stream::unfold(0, move |sent| {
            let completed = completed.clone();
            async move {
                if sent == count {
                    completed.inc();
                    return None;
                }
                if sent > 0 {
                    tokio::time::sleep(every).await;
                }
                Some((Ok(PriceReply { price_cents }), sent + 1))
            }
        });
        Ok(Response::new(Box::pin(prices)))
    }

    async fn price_basket(
        &self,
        request: Request<Streaming<PriceRequest>>,
    ) -> Result<Response<BasketReply>, Status> {
        self.faults().await?;
        let mut items = request.into_inner();
        let mut basket = BasketReply::default();
        // Each item is priced as it arrives: the caller may still be writing the next.
        while let Some(item) = items.message().await? {
            self.metrics.work_started.inc();
            basket.items += 1;
            basket.total_cents += u64::from(item.list_price_cents);
            self.metrics.work_completed.inc();
        }
        Ok(Response::new(basket))
    }
}

async fn bind(addr: SocketAddr, variable: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({variable})"))
}
