//! catalog-service with `PRICING_URL`: a real pricing-service over gRPC behind it, each
//! promise read on pricing's own `/metrics`.

use std::time::Duration;

use catalog_service::{Application, Config};
use reqwest::StatusCode;
use serde_json::Value;
use service_kit::faults::{FaultConfig, Faults};
use test_support::exposition::{parse, sum};
use test_support::{Running, wait_until};
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

struct Chain {
    catalog: String,
    pricing_admin: String,
    pricing_faults: Faults,
    client: reqwest::Client,
    _running: (Running, Running),
}

async fn spawn_chain() -> Chain {
    let pricing = pricing_service::Application::build(pricing_service::Config::for_tests())
        .await
        .unwrap();
    let mut config = Config::for_tests();
    config.pricing_url = Some(format!("http://127.0.0.1:{}", pricing.port()));
    let catalog = Application::build(config).await.unwrap();
    Chain {
        catalog: format!("http://127.0.0.1:{}", catalog.port()),
        pricing_admin: format!("http://127.0.0.1:{}", pricing.admin_port()),
        pricing_faults: pricing.faults(),
        client: reqwest::Client::new(),
        _running: (
            test_support::spawn(|shutdown| pricing.run_until(shutdown)),
            test_support::spawn(|shutdown| catalog.run_until(shutdown)),
        ),
    }
}

impl Chain {
    async fn get(&self, budget_ms: u64, previous_attempts: Option<u32>) -> reqwest::Response {
        let mut request = self
            .client
            .get(format!("{}/catalog/SKU-00042", self.catalog))
            .header("X-Request-Timeout-Ms", budget_ms);
        if let Some(n) = previous_attempts {
            request = request.header("X-Previous-Attempts", n);
        }
        request.send().await.unwrap()
    }

    /// Calls pricing answered, by gRPC code, on its own `/metrics`.
    async fn pricing_calls(&self, code: &str) -> f64 {
        let text = test_support::scrape(&self.client, &self.pricing_admin).await;
        sum(
            &parse(&text),
            "grpc_server_handled_total",
            &[("grpc_code", code)],
        )
        .unwrap_or(0.0)
    }

    fn fail(&self, faults: FaultConfig) {
        self.pricing_faults.set(faults);
    }
}

#[tokio::test]
async fn the_item_is_priced_by_pricing() {
    let chain = spawn_chain().await;
    let answer = chain.get(1_000, None).await;
    assert_eq!(answer.status(), StatusCode::OK);
    let timing = answer.headers()["server-timing"]
        .to_str()
        .unwrap()
        .to_owned();
    let item: Value = answer.json().await.unwrap();
    assert_eq!(item["sku"], "SKU-00042");
    assert_eq!(chain.pricing_calls("OK").await, 1.0);
    assert!(timing.contains("pricing"), "Server-Timing: {timing}");
}

#[tokio::test]
async fn pricing_slow_past_the_budget_is_a_504_with_stage_pricing() {
    let chain = spawn_chain().await;
    chain.fail(FaultConfig {
        delay_ms: 5_000,
        ..FaultConfig::default()
    });
    let start = Instant::now();
    let answer = chain.get(300, None).await;
    let took = start.elapsed();
    assert_eq!(answer.status(), StatusCode::GATEWAY_TIMEOUT);
    let problem: Value = answer.json().await.unwrap();
    assert_eq!(problem["stage"], "pricing", "{problem}");
    assert!(took < MS(800), "answered after {took:?}");
    // Pricing itself stopped at the budget it was sent (long before its 5 s): it counted
    // the call, once, not as answered. Two timers are set from that budget, and which
    // fires first is a race no test can fix: pricing's deadline (it answers
    // DEADLINE_EXCEEDED a few milliseconds early, to beat the caller's timer) and the
    // catalog's tonic timer, started as the call left, before the request reached
    // pricing. When the request takes longer than that margin to arrive (a loaded
    // machine; the first call's connection still being accepted), the catalog's timer
    // fires first and resets the stream, and pricing counts its dropped call CANCELLED.
    // The catalog's answer, held strictly above, is the same either way; pricing's own
    // DEADLINE_EXCEEDED is held strictly in pricing-service/tests/grpc.rs, by a caller
    // with no timer of its own.
    wait_until("pricing counts its call", MS(2_000), || async {
        let exceeded = chain.pricing_calls("DEADLINE_EXCEEDED").await;
        exceeded + chain.pricing_calls("CANCELLED").await == 1.0
    })
    .await;
    let handled = test_support::scrape(&chain.client, &chain.pricing_admin).await;
    let all = sum(&parse(&handled), "grpc_server_handled_total", &[]);
    assert_eq!(all, Some(1.0), "one call, stopped:\n{handled}");
}

#[tokio::test]
async fn unavailable_pricing_is_retried_only_where_no_caller_above_retries() {
    let chain = spawn_chain().await;
    chain.fail(FaultConfig {
        error_rate: 1.0,
        ..FaultConfig::default()
    });
    // Called directly, the catalog owns retries: one retry.
    let answer = chain.get(2_000, None).await;
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem: Value = answer.json().await.unwrap();
    assert_eq!(problem["stage"], "pricing", "{problem}");
    assert_eq!(chain.pricing_calls("UNAVAILABLE").await, 2.0);
    // Called by a hop that retries (it numbers its attempts): no retry here, so the
    // caller's attempts reach pricing once each, not multiplied.
    for attempt in 0..3 {
        let answer = chain.get(2_000, Some(attempt)).await;
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(chain.pricing_calls("UNAVAILABLE").await, 2.0 + 3.0);
}

#[tokio::test]
async fn pricing_down_is_a_prompt_503_and_the_catalog_still_starts() {
    // A port with nothing behind it.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = gone.local_addr().unwrap().port();
    drop(gone);
    let mut config = Config::for_tests();
    config.pricing_url = Some(format!("http://127.0.0.1:{port}"));
    let catalog = Application::build(config)
        .await
        .expect("starts without pricing");
    let base = format!("http://127.0.0.1:{}", catalog.port());
    let _running = test_support::spawn(|shutdown| catalog.run_until(shutdown));
    let start = Instant::now();
    let answer = reqwest::Client::new()
        .get(format!("{base}/catalog/SKU-00042"))
        .header("X-Request-Timeout-Ms", 2_000)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        start.elapsed() < MS(1_000),
        "answered after {:?}",
        start.elapsed()
    );
    let problem: Value = answer.json().await.unwrap();
    assert_eq!(problem["stage"], "pricing", "{problem}");
}
