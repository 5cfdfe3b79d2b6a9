//! pricing-service over real gRPC (tonic, HTTP/2 on port 0), each promise read on the
//! server: its `/metrics` on the admin port, never the client's own view.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use deadline_propagation::grpc::{GrpcClient, GrpcClientLayer, GrpcServerLayer};
use deadline_propagation::{Deadline, DeadlinePolicy, Downstream};
use futures_util::Stream;
use http_body_util::BodyExt as _;
use pricing_service::metrics::GrpcMetrics;
use pricing_service::proto::pricing_client::PricingClient;
use pricing_service::proto::pricing_server::{Pricing as PricingApi, PricingServer};
use pricing_service::proto::{BasketReply, PriceReply, PriceRequest, WatchRequest};
use pricing_service::{Application, Config};
use prometheus_client::registry::Registry;
use service_kit::faults::{FaultConfig, Faults};
use test_support::exposition::{parse, sum};
use test_support::{Running, wait_until};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

const MS: fn(u64) -> Duration = Duration::from_millis;

struct Pricing {
    url: String,
    admin: String,
    faults: Faults,
    _running: Running,
}

/// The method catalog-service calls, declared idempotent as it does.
const PRICE: &str = "/pricing.v1.Pricing/Price";

async fn spawn() -> Pricing {
    spawn_with(Config::for_tests()).await
}

async fn spawn_with(config: Config) -> Pricing {
    let app = Application::build(config).await.unwrap();
    Pricing {
        url: format!("http://127.0.0.1:{}", app.port()),
        admin: format!("http://127.0.0.1:{}", app.admin_port()),
        faults: app.faults(),
        _running: test_support::spawn(|shutdown| app.run_until(shutdown)),
    }
}

impl Pricing {
    async fn channel(&self) -> Channel {
        Channel::from_shared(self.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// A client through the crate's layer, as catalog-service makes it.
    async fn budgeted(&self, retry: bool) -> PricingClient<GrpcClient<Channel>> {
        let pricing = Downstream::new("pricing").unwrap();
        let layer = GrpcClientLayer::new(pricing)
            .retry(retry)
            .idempotent([PRICE]);
        PricingClient::new(
            tower::ServiceBuilder::new()
                .layer(layer)
                .service(self.channel().await),
        )
    }

    /// The sum of a family's samples on the server's `/metrics` (labels to match).
    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = test_support::scrape(&reqwest::Client::new(), &self.admin).await;
        sum(&parse(&text), name, labels).unwrap_or(0.0)
    }

    async fn handled(&self, code: &str) -> f64 {
        self.metric("grpc_server_handled_total", &[("grpc_code", code)])
            .await
    }
}

fn request() -> PriceRequest {
    PriceRequest {
        sku: "SKU-00042".to_owned(),
        list_price_cents: 1234,
    }
}

#[tokio::test]
async fn the_budget_arrives_with_no_timeout_at_the_call_site() {
    let pricing = spawn().await;
    let mut client = pricing.budgeted(false).await;
    // The call site sets nothing: the deadline is the task's current one, as the
    // ingress sets it around every handler.
    let reply = Deadline::after(MS(300))
        .scope(client.price(request()))
        .await
        .expect("priced");
    assert_eq!(reply.into_inner().price_cents, 1234);
    // What the server took as the call's budget: at most the 300 ms sent (less what
    // the hop took), far below the 5 s it grants a call with no grpc-timeout.
    let budget = pricing
        .metric("deadline_inbound_budget_seconds_sum", &[])
        .await;
    let calls = pricing
        .metric("deadline_inbound_budget_seconds_count", &[])
        .await;
    assert_eq!(calls, 1.0);
    assert!(
        budget > 0.2 && budget <= 0.3,
        "the server's budget: {budget} s"
    );
}

#[tokio::test]
async fn a_spent_budget_is_deadline_exceeded_not_cancelled() {
    let pricing = spawn().await;
    pricing.faults.set(FaultConfig {
        delay_ms: 5_000,
        ..FaultConfig::default()
    });
    // A plain tonic client, as any caller: the timeout set on the request is sent as
    // grpc-timeout. tonic's own server answers CANCELLED when it fires.
    let mut client = PricingClient::new(pricing.channel().await);
    let mut call = tonic::Request::new(request());
    call.set_timeout(MS(200));
    let start = Instant::now();
    client.price(call).await.expect_err("past the budget");
    assert!(
        start.elapsed() < MS(1_000),
        "answered after {:?}",
        start.elapsed()
    );
    // What the server answered (the plain client's own timer fires at the same instant
    // and calls it CANCELLED locally: the crate's client layer says DEADLINE_EXCEEDED,
    // the next test).
    wait_until("the server counts its answer", MS(2_000), || async {
        pricing.metric("grpc_server_handled_total", &[]).await == 1.0
    })
    .await;
    assert_eq!(pricing.handled("DEADLINE_EXCEEDED").await, 1.0);
    assert_eq!(pricing.handled("CANCELLED").await, 0.0);
    // By its own deadline, not at the injected 5 s (a loaded machine's margin: the
    // experiment measures it to the millisecond).
    let in_time = [("le", "0.1")];
    let overrun = "deadline_overrun_seconds_bucket";
    assert_eq!(pricing.metric(overrun, &in_time).await, 1.0);
}

#[tokio::test]
async fn the_handlers_work_is_dropped_at_the_deadline() {
    let pricing = spawn().await;
    let delay = MS(800);
    pricing.faults.set(FaultConfig {
        delay_ms: delay.as_millis() as u64,
        ..FaultConfig::default()
    });
    let mut client = pricing.budgeted(false).await;
    let start = Instant::now();
    let status = Deadline::after(MS(150))
        .scope(client.price(request()))
        .await
        .expect_err("past the budget");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(pricing.metric("pricing_work_started_total", &[]).await, 1.0);
    // The work would have ended at `delay`; past that (with room for a loaded machine)
    // it has still not completed: it was dropped, not left running.
    tokio::time::sleep_until(start + delay + MS(400)).await;
    assert_eq!(
        pricing.metric("pricing_work_completed_total", &[]).await,
        0.0
    );
}

#[tokio::test]
async fn a_spent_budget_starts_no_call() {
    let pricing = spawn().await;
    let mut client = pricing.budgeted(true).await;
    let deadline = Deadline::after(MS(1));
    tokio::time::sleep_until(deadline.instant() + MS(5)).await;
    let status = deadline
        .scope(client.price(request()))
        .await
        .expect_err("no budget left");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(pricing.metric("grpc_server_handled_total", &[]).await, 0.0);
}

#[tokio::test]
async fn unavailable_is_retried_once_by_the_hop_that_owns_retries() {
    let pricing = spawn().await;
    pricing.faults.set(FaultConfig {
        error_rate: 1.0,
        ..FaultConfig::default()
    });
    let mut client = pricing.budgeted(true).await;
    let status = Deadline::after(MS(2_000))
        .scope(client.price(request()))
        .await
        .expect_err("pricing fails every call");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    wait_until("both attempts are counted", MS(2_000), || async {
        pricing.handled("UNAVAILABLE").await == 2.0
    })
    .await;
}

/// The sample lines of the server's `/metrics`: one per series.
async fn series(pricing: &Pricing) -> usize {
    let text = test_support::scrape(&reqwest::Client::new(), &pricing.admin).await;
    text.lines().filter(|line| !line.starts_with('#')).count()
}

#[tokio::test]
async fn made_up_method_paths_share_one_label() {
    let pricing = spawn().await;
    // One real call first, so that the families of a known method exist.
    let mut client = PricingClient::new(pricing.channel().await);
    client.price(request()).await.expect("priced");
    let before = series(&pricing).await;
    // Any path a caller makes up, as a scanner or a stale client sends.
    let mut grpc = tonic::client::Grpc::new(pricing.channel().await);
    for n in 0..300 {
        let path = format!("/x.Y{n}/Z{n}").parse().unwrap();
        let codec = tonic_prost::ProstCodec::<PriceRequest, PriceReply>::default();
        grpc.ready().await.unwrap();
        let status = grpc
            .unary(tonic::Request::new(request()), path, codec)
            .await
            .expect_err("no such method");
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    }
    // One label for all of them: a counter and a histogram's series, not 300 of each.
    let other = [("grpc_service", "other"), ("grpc_method", "other")];
    let counted = pricing.metric("grpc_server_handled_total", &other).await;
    assert_eq!(counted, 300.0);
    let added = series(&pricing).await - before;
    assert!(added <= 30, "{added} new series");
}

#[tokio::test]
async fn observe_metadata_is_honoured_only_where_the_operator_turns_it_on() {
    // A call with no grpc-timeout gets the default budget; pricing is slower than that.
    let mut config = Config::for_tests();
    config.deadline_default_ms = 300;
    let delay = MS(900);
    let observing = || {
        let mut call = tonic::Request::new(request());
        call.metadata_mut()
            .insert("x-deadline-mode", "observe".parse().unwrap());
        call
    };
    // At an edge (the default): the marker changes nothing, the clamp holds.
    let edge = spawn_with(config.clone()).await;
    edge.faults.set(FaultConfig {
        delay_ms: delay.as_millis() as u64,
        ..FaultConfig::default()
    });
    let start = Instant::now();
    let status = PricingClient::new(edge.channel().await)
        .price(observing())
        .await
        .expect_err("cut by the service's own default");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        start.elapsed() < delay,
        "answered after {:?}",
        start.elapsed()
    );
    assert_eq!(edge.handled("DEADLINE_EXCEEDED").await, 1.0);
    // Turned on (called only by the operator's own services): observed, and counted.
    config.honour_observe = true;
    let inner = spawn_with(config).await;
    inner.faults.set(FaultConfig {
        delay_ms: delay.as_millis() as u64,
        ..FaultConfig::default()
    });
    PricingClient::new(inner.channel().await)
        .price(observing())
        .await
        .expect("observed, not refused");
    assert_eq!(inner.handled("OK").await, 1.0);
    let would = inner.metric("deadline_would_refuse_total", &[]).await;
    assert_eq!(would, 1.0);
}

fn watch(count: u32, every: Duration) -> WatchRequest {
    WatchRequest {
        item: Some(request()),
        count,
        every_ms: every.as_millis() as u32,
    }
}

/// Reads a server stream to its end: the prices, each with when it came, and how the
/// stream ended.
async fn read_stream(
    mut prices: tonic::Streaming<PriceReply>,
    start: Instant,
) -> (Vec<Duration>, Result<(), Status>) {
    let mut came = Vec::new();
    loop {
        match prices.message().await {
            Ok(Some(_)) => came.push(start.elapsed()),
            Ok(None) => return (came, Ok(())),
            Err(status) => return (came, Err(status)),
        }
    }
}

#[tokio::test]
async fn a_server_stream_through_both_layers_ends_at_the_deadline_with_deadline_exceeded() {
    let pricing = spawn().await;
    let mut client = pricing.budgeted(true).await;
    let every = MS(100);
    let start = Instant::now();
    let (came, end) = Deadline::after(MS(450))
        .scope(async {
            let prices = client.watch_price(watch(40, every)).await?.into_inner();
            Ok::<_, Status>(read_stream(prices, start).await)
        })
        .await
        .expect("the stream began");
    let status = end.expect_err("cut at the deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    // The first price came at once, long before the stream ended; a few more followed.
    assert!(came[0] < MS(300), "the first price after {:?}", came[0]);
    assert!(came.len() >= 2 && came.len() < 10, "{came:?}");
    assert!(
        start.elapsed() < MS(1_500),
        "ended after {:?}",
        start.elapsed()
    );
    // The server's side: the watch began and never ran to its end.
    assert_eq!(pricing.metric("pricing_work_started_total", &[]).await, 1.0);
    tokio::time::sleep_until(start + every * 40 / 10).await;
    assert_eq!(
        pricing.metric("pricing_work_completed_total", &[]).await,
        0.0
    );
}

#[tokio::test]
async fn a_server_stream_ends_at_its_grpc_timeout_on_the_server() {
    let pricing = spawn().await;
    // A plain tonic client: only the server layer bounds the stream.
    let mut client = PricingClient::new(pricing.channel().await);
    let mut call = tonic::Request::new(watch(40, MS(100)));
    call.set_timeout(MS(450));
    let start = Instant::now();
    let prices = client.watch_price(call).await.expect("began").into_inner();
    let (came, end) = read_stream(prices, start).await;
    let status = end.expect_err("cut by the server");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(came[0] < MS(300), "the first price after {:?}", came[0]);
    assert!(came.len() < 10, "{came:?}");
    assert!(
        start.elapsed() < MS(1_500),
        "ended after {:?}",
        start.elapsed()
    );
    // The server counts the stream by the status in its trailers, not as the OK its
    // head said when it began.
    wait_until("the server counts the stream", MS(2_000), || async {
        pricing.metric("grpc_server_handled_total", &[]).await == 1.0
    })
    .await;
    let watch = [
        ("grpc_method", "WatchPrice"),
        ("grpc_code", "DEADLINE_EXCEEDED"),
    ];
    assert_eq!(
        pricing.metric("grpc_server_handled_total", &watch).await,
        1.0
    );
}

fn item(cents: u32) -> PriceRequest {
    PriceRequest {
        sku: "SKU-00042".to_owned(),
        list_price_cents: cents,
    }
}

#[tokio::test]
async fn a_client_stream_reaches_the_server_as_it_is_written() {
    let pricing = spawn().await;
    let mut client = pricing.budgeted(true).await;
    let (items, written) = tokio::sync::mpsc::channel(4);
    let call = tokio::spawn(
        Deadline::after(MS(10_000))
            .scope(async move { client.price_basket(ReceiverStream::new(written)).await }),
    );
    items.send(item(100)).await.unwrap();
    // The stream is still open: the server has the first item all the same.
    wait_until("the server prices the first item", MS(3_000), || async {
        pricing.metric("pricing_work_started_total", &[]).await == 1.0
    })
    .await;
    items.send(item(250)).await.unwrap();
    drop(items);
    let basket = call
        .await
        .unwrap()
        .expect("the basket's total")
        .into_inner();
    assert_eq!(
        basket,
        BasketReply {
            items: 2,
            total_cents: 350
        }
    );
}

#[tokio::test]
async fn a_client_stream_still_open_at_the_deadline_is_deadline_exceeded() {
    let pricing = spawn().await;
    let mut client = pricing.budgeted(true).await;
    let (items, written) = tokio::sync::mpsc::channel(4);
    items.send(item(100)).await.unwrap();
    let start = Instant::now();
    let call = Deadline::after(MS(300)).scope(client.price_basket(ReceiverStream::new(written)));
    // A bound on the test, far past the deadline: the stream never ends.
    let status = tokio::time::timeout(MS(5_000), call)
        .await
        .expect("answered by its deadline")
        .expect_err("the stream was not ended");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        start.elapsed() < MS(1_500),
        "answered after {:?}",
        start.elapsed()
    );
    assert_eq!(pricing.metric("pricing_work_started_total", &[]).await, 1.0);
    drop(items);
}

#[tokio::test]
async fn the_callers_own_shorter_timeout_is_kept() {
    let pricing = spawn().await;
    pricing.faults.set(FaultConfig {
        delay_ms: 1_000,
        ..FaultConfig::default()
    });
    let mut client = pricing.budgeted(false).await;
    let mut call = tonic::Request::new(request());
    call.set_timeout(MS(50));
    let start = Instant::now();
    let status = Deadline::after(MS(2_000))
        .scope(client.price(call))
        .await
        .expect_err("past the caller's own timeout");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        start.elapsed() < MS(700),
        "answered after {:?}",
        start.elapsed()
    );
    // What the server was given: at most the caller's 50 ms, not the 2 s budget.
    let budget = pricing
        .metric("deadline_inbound_budget_seconds_sum", &[])
        .await;
    assert!(
        budget > 0.0 && budget <= 0.05,
        "the server's budget: {budget} s"
    );
}

#[tokio::test]
async fn unavailable_is_not_retried_for_a_method_not_declared_idempotent() {
    let pricing = spawn().await;
    pricing.faults.set(FaultConfig {
        error_rate: 1.0,
        ..FaultConfig::default()
    });
    let pricing_name = Downstream::new("pricing").unwrap();
    // Retries on, but nothing declared safe to run twice.
    let layer = GrpcClientLayer::new(pricing_name).retry(true);
    let channel = tower::ServiceBuilder::new()
        .layer(layer)
        .service(pricing.channel().await);
    let status = Deadline::after(MS(2_000))
        .scope(PricingClient::new(channel).price(request()))
        .await
        .expect_err("pricing fails every call");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    // The server counts an answer before it sends it: a retry would be counted by now.
    assert_eq!(pricing.handled("UNAVAILABLE").await, 1.0);
}

#[tokio::test]
async fn a_refused_connection_is_retried_whatever_the_method() {
    let pricing = spawn().await;
    // A port nobody listens on: the first connection is refused there.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_addr = closed.local_addr().unwrap();
    drop(closed);
    let open_addr = pricing.url.trim_start_matches("http://").to_owned();
    let connects = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&connects);
    let connector = tower::service_fn(move |_: http::Uri| {
        let nth = counted.fetch_add(1, Ordering::SeqCst);
        let open_addr = open_addr.clone();
        async move {
            let stream = match nth {
                0 => TcpStream::connect(closed_addr).await?,
                _ => TcpStream::connect(open_addr).await?,
            };
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    let channel = Endpoint::from_shared(pricing.url.clone())
        .unwrap()
        .connect_with_connector_lazy(connector);
    // Retries on, no method declared idempotent: a refused connection sent nothing.
    let layer = GrpcClientLayer::new(Downstream::new("pricing").unwrap()).retry(true);
    let channel = tower::ServiceBuilder::new().layer(layer).service(channel);
    let reply = Deadline::after(MS(2_000))
        .scope(PricingClient::new(channel).price(request()))
        .await
        .expect("priced on the second connection");
    assert_eq!(reply.into_inner().price_cents, 1234);
    assert_eq!(connects.load(Ordering::SeqCst), 2);
    assert_eq!(pricing.handled("OK").await, 1.0);
}

#[tokio::test]
async fn the_wait_for_channel_capacity_is_under_the_deadline() {
    let pricing = spawn().await;
    pricing.faults.set(FaultConfig {
        delay_ms: 1_500,
        ..FaultConfig::default()
    });
    // A channel that carries one call at a time (as a concurrency limit makes it).
    let layer = GrpcClientLayer::new(Downstream::new("pricing").unwrap());
    let channel = tower::ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service(pricing.channel().await);
    let mut first = PricingClient::new(channel.clone());
    let busy =
        tokio::spawn(Deadline::after(MS(4_000)).scope(async move { first.price(request()).await }));
    wait_until("the first call is at the server", MS(2_000), || async {
        pricing.metric("pricing_work_started_total", &[]).await == 1.0
    })
    .await;
    let start = Instant::now();
    let status = Deadline::after(MS(200))
        .scope(PricingClient::new(channel).price(request()))
        .await
        .expect_err("no capacity within the budget");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        start.elapsed() < MS(800),
        "answered after {:?}",
        start.elapsed()
    );
    busy.abort();
}

/// A middle hop: a gRPC service under the server layer whose handler calls pricing
/// through the client layer, retrying at every hop.
struct Proxy {
    pricing: PricingClient<GrpcClient<Channel>>,
}

type Prices = Pin<Box<dyn Stream<Item = Result<PriceReply, Status>> + Send>>;

#[tonic::async_trait]
impl PricingApi for Proxy {
    async fn price(
        &self,
        request: tonic::Request<PriceRequest>,
    ) -> Result<tonic::Response<PriceReply>, Status> {
        self.pricing.clone().price(request.into_inner()).await
    }

    type WatchPriceStream = Prices;

    async fn watch_price(
        &self,
        _: tonic::Request<WatchRequest>,
    ) -> Result<tonic::Response<Prices>, Status> {
        Err(Status::unimplemented("not proxied"))
    }

    async fn price_basket(
        &self,
        _: tonic::Request<tonic::Streaming<PriceRequest>>,
    ) -> Result<tonic::Response<BasketReply>, Status> {
        Err(Status::unimplemented("not proxied"))
    }
}

/// Serves `service` under the server layer on port 0; the URL to call it.
async fn serve<T: PricingApi>(layer: GrpcServerLayer, service: T) -> (String, Running) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let running = test_support::spawn(|shutdown| async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(PricingServer::new(service))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
            .await
            .unwrap();
    });
    (url, running)
}

#[tokio::test]
async fn the_largest_previous_attempts_saturate_instead_of_overflowing() {
    let pricing = spawn().await;
    pricing.faults.set(FaultConfig {
        error_rate: 1.0,
        ..FaultConfig::default()
    });
    let layer = GrpcClientLayer::new(Downstream::new("pricing").unwrap())
        .retry(true)
        .retry_every_hop(true)
        .idempotent([PRICE]);
    let channel = tower::ServiceBuilder::new()
        .layer(layer)
        .service(pricing.channel().await);
    let proxy = Proxy {
        pricing: PricingClient::new(channel),
    };
    let policy = DeadlinePolicy::from_millis(2_000, 2_000);
    let (url, _proxy) = serve(GrpcServerLayer::new(policy), proxy).await;
    let channel = Endpoint::from_shared(url).unwrap().connect().await.unwrap();
    for header in ["x-previous-attempts", "grpc-previous-rpc-attempts"] {
        let mut call = tonic::Request::new(request());
        call.metadata_mut()
            .insert(header, u32::MAX.to_string().parse().unwrap());
        let status = PricingClient::new(channel.clone())
            .price(call)
            .await
            .expect_err("pricing fails every call");
        assert_eq!(status.code(), Code::Unavailable, "{header}: {status:?}");
    }
    // Each hop retried on its own, as asked: two attempts per call.
    assert_eq!(pricing.handled("UNAVAILABLE").await, 4.0);
}

/// A handler that passes its point of no return (a COMMIT on the wire) at once, then
/// takes `takes`.
struct Committing {
    takes: Duration,
}

#[tonic::async_trait]
impl PricingApi for Committing {
    async fn price(
        &self,
        request: tonic::Request<PriceRequest>,
    ) -> Result<tonic::Response<PriceReply>, Status> {
        let deadline = Deadline::current().expect("the server layer sets it");
        let _committing = deadline.point_of_no_return();
        tokio::time::sleep(self.takes).await;
        Ok(tonic::Response::new(PriceReply {
            price_cents: request.into_inner().list_price_cents,
        }))
    }

    type WatchPriceStream = Prices;

    async fn watch_price(
        &self,
        _: tonic::Request<WatchRequest>,
    ) -> Result<tonic::Response<Prices>, Status> {
        Err(Status::unimplemented("not here"))
    }

    async fn price_basket(
        &self,
        _: tonic::Request<tonic::Streaming<PriceRequest>>,
    ) -> Result<tonic::Response<BasketReply>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

/// The committing handler under the server layer, counted by pricing's metrics layer
/// (read from its registry, as `/metrics` would show it).
async fn committing(takes: Duration) -> (PricingClient<Channel>, Registry, Running) {
    let mut registry = Registry::default();
    let metrics = GrpcMetrics::register(&mut registry);
    // The service's own budget: 300 ms for a call without grpc-timeout.
    let layer = GrpcServerLayer::new(DeadlinePolicy::from_millis(300, 300));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let running = test_support::spawn(|shutdown| async move {
        let layers = tower::ServiceBuilder::new()
            .layer(metrics)
            .layer(layer)
            .into_inner();
        tonic::transport::Server::builder()
            .layer(layers)
            .add_service(PricingServer::new(Committing { takes }))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
            .await
            .unwrap();
    });
    let channel = Endpoint::from_shared(url).unwrap().connect().await.unwrap();
    (PricingClient::new(channel), registry, running)
}

fn handled(registry: &Registry, code: &str) -> f64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    let labels = [("grpc_code", code)];
    sum(&parse(&text), "grpc_server_handled_total", &labels).unwrap_or(0.0)
}

#[tokio::test]
async fn a_handler_past_its_point_of_no_return_gets_the_grace_then_unknown() {
    // Done within the grace: its answer, not DEADLINE_EXCEEDED.
    let (mut client, _, _server) = committing(MS(450)).await;
    let reply = client
        .price(request())
        .await
        .expect("the outcome, in the grace");
    assert_eq!(reply.into_inner().price_cents, 1234);
    // Still running at the grace's end: UNKNOWN (DEADLINE_EXCEEDED would say that
    // nothing was done).
    let (mut client, registry, _server) = committing(MS(5_000)).await;
    let start = Instant::now();
    let status = client
        .price(request())
        .await
        .expect_err("no outcome in time");
    assert_eq!(status.code(), Code::Unknown, "{status:?}");
    let grace = deadline_propagation::NO_RETURN_GRACE;
    assert!(
        start.elapsed() >= MS(290) + grace,
        "after {:?}",
        start.elapsed()
    );
    assert!(start.elapsed() < MS(2_500), "after {:?}", start.elapsed());
    // Under the caller's grpc-timeout, tonic's own timer leaves no grace: the server
    // answers UNKNOWN before it (not its CANCELLED, not DEADLINE_EXCEEDED). The
    // client's own timer, at the same grpc-timeout, may call it CANCELLED locally.
    let mut call = tonic::Request::new(request());
    call.set_timeout(MS(200));
    let status = client.price(call).await.expect_err("no outcome in time");
    assert!(
        matches!(status.code(), Code::Unknown | Code::Cancelled),
        "{status:?}"
    );
    wait_until("the server counts its answer", MS(2_000), || async {
        handled(&registry, "UNKNOWN") == 2.0
    })
    .await;
    assert_eq!(handled(&registry, "DEADLINE_EXCEEDED"), 0.0);
}

/// One `Price` call sent by hand over HTTP/2 with `grpc-timeout` as given, and no timer
/// of its own (a tonic client times the call out itself at the same value and may cancel
/// first): the status the server answered.
async fn raw_price(addr: &str, grpc_timeout: &str) -> String {
    let stream = TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let executor = hyper_util::rt::TokioExecutor::new();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(executor, io)
        .await
        .unwrap();
    tokio::spawn(connection);
    // A gRPC message: not compressed, its length, then the message.
    let message = prost::Message::encode_to_vec(&request());
    let mut framed = vec![0];
    framed.extend((message.len() as u32).to_be_bytes());
    framed.extend(message);
    let call = http::Request::post(format!("http://{addr}/pricing.v1.Pricing/Price"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", grpc_timeout)
        .body(http_body_util::Full::new(bytes::Bytes::from(framed)))
        .unwrap();
    let answer = sender.send_request(call).await.unwrap();
    let status = |headers: &http::HeaderMap| headers.get("grpc-status").cloned();
    let code = match status(answer.headers()) {
        Some(code) => code,
        None => {
            let body = answer.into_body().collect().await.unwrap();
            body.trailers().and_then(status).expect("a status")
        }
    };
    code.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_grpc_timeout_of_a_fraction_of_a_millisecond_is_answered_deadline_exceeded() {
    let pricing = spawn().await;
    pricing.faults.set(FaultConfig {
        delay_ms: 2_000,
        ..FaultConfig::default()
    });
    let addr = pricing.url.trim_start_matches("http://");
    let values = ["100999u", "100001u", "99999999n", "50000001n", "100m"];
    let calls = values
        .iter()
        .cycle()
        .take(20)
        .map(|value| async move { (value, raw_price(addr, value).await) });
    for (value, code) in futures_util::future::join_all(calls).await {
        // 4 is the server layer's DEADLINE_EXCEEDED; tonic's own timer would say 1
        // (CANCELLED).
        assert_eq!(code, "4", "{value}");
    }
    assert_eq!(pricing.handled("DEADLINE_EXCEEDED").await, 20.0);
}
