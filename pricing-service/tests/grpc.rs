//! pricing-service over real gRPC (tonic, HTTP/2 on port 0), each promise read on the
//! server: its `/metrics` on the admin port, never the client's own view.

use std::time::Duration;

use deadline_propagation::grpc::{GrpcClient, GrpcClientLayer};
use deadline_propagation::{Deadline, Downstream};
use pricing_service::proto::PriceRequest;
use pricing_service::proto::pricing_client::PricingClient;
use pricing_service::{Application, Config};
use service_kit::faults::{FaultConfig, Faults};
use test_support::exposition::{parse, sum};
use test_support::{Running, wait_until};
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;

const MS: fn(u64) -> Duration = Duration::from_millis;

struct Pricing {
    url: String,
    admin: String,
    faults: Faults,
    _running: Running,
}

async fn spawn() -> Pricing {
    let app = Application::build(Config::for_tests()).await.unwrap();
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
        let layer = GrpcClientLayer::new(pricing).retry_unavailable(retry);
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
