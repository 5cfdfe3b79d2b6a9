//! Hedging and the retry budget against a real downstream on port 0, through the public
//! API: a slow first attempt gets a hedge and the loser is dropped (the downstream sees
//! its request go away), and each check that keeps an extra attempt from being sent
//! (the deadline, the budget, a free slot, a request not safe to send twice) holds and
//! is counted in `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use deadline_propagation::client::{BudgetedClient, CallErrorKind, ClientConfig};
use deadline_propagation::hedging::{HedgePolicy, Hedging};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::retry_budget::{RetryBudget, RetryTokens};
use deadline_propagation::testing::metric_value;
use deadline_propagation::{Deadline, Downstream};
use http::Method;
use tokio::net::TcpListener;

const MS: fn(u64) -> Duration = Duration::from_millis;
/// What the downstream takes for a normal call.
const NORMAL: Duration = Duration::from_millis(10);
/// What a straggler takes.
const STALL: Duration = Duration::from_secs(2);

/// The downstream's side of the test: the next request stalls, 503s, or answers after
/// [`NORMAL`]; how many requests it received and how many of their handlers were
/// dropped unfinished (their caller went away).
#[derive(Default)]
struct Downstream_ {
    stall_next: AtomicBool,
    unavailable_next: AtomicBool,
    received: AtomicUsize,
    abandoned: AtomicUsize,
}

/// Counts a handler dropped before it answered.
struct Abandoned(Arc<Downstream_>, bool);

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.1 {
            self.0.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn handle(State(state): State<Arc<Downstream_>>) -> StatusCode {
    state.received.fetch_add(1, Ordering::SeqCst);
    if state.unavailable_next.swap(false, Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let mut guard = Abandoned(state.clone(), false);
    let stall = state.stall_next.swap(false, Ordering::SeqCst);
    tokio::time::sleep(if stall { STALL } else { NORMAL }).await;
    guard.1 = true;
    StatusCode::OK
}

struct Setup {
    client: BudgetedClient,
    metrics: Metrics,
    downstream: Arc<Downstream_>,
    _server: tokio::task::JoinHandle<()>,
}

async fn setup(max_connections: u32, hedge: HedgePolicy, retry_budget: RetryBudget) -> Setup {
    let downstream = Arc::new(Downstream_::default());
    let router = Router::new()
        .route("/item", get(handle))
        .route("/item", post(handle))
        .with_state(downstream.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let metrics = Metrics::new("test");
    let mut config = ClientConfig::new(Downstream::new("inventory").unwrap(), base_url);
    config.max_connections = max_connections;
    config.pending_max = 100;
    config.acquire_timeout = Duration::from_secs(5);
    let client = BudgetedClient::new(config)
        .unwrap()
        .plugin(Hedging::new(hedge))
        .plugin(RetryTokens::new(retry_budget))
        .with_metrics(&metrics);
    Setup {
        client,
        metrics,
        downstream,
        _server: server,
    }
}

/// A policy that hedges once 20 calls are known, at their p95.
fn policy() -> HedgePolicy {
    let mut policy = HedgePolicy::default();
    policy.max_extra_load = 0.05;
    policy.min_samples = 20;
    policy
}

impl Setup {
    /// Enough quick calls for the history to give a delay. They are POSTs without a key,
    /// never hedged, so no test starts with a hedge already counted (a learning call a
    /// little slower than the delay would otherwise get one).
    async fn learn(&self) {
        for _ in 0..30 {
            self.client
                .request(Method::POST, "/item")
                .send(&Deadline::after(Duration::from_secs(2)))
                .await
                .expect("a quick call");
        }
    }

    async fn get(
        &self,
        budget: Duration,
    ) -> Result<deadline_propagation::client::Reply, deadline_propagation::client::CallError> {
        self.client
            .request(Method::GET, "/item")
            .send(&Deadline::after(budget))
            .await
    }

    fn attempts(&self, kind: &str, outcome: &str) -> f64 {
        let labels = format!(r#"client="inventory",kind="{kind}",outcome="{outcome}""#);
        metric_value(
            &self.metrics.render(),
            "http_client_attempts_total",
            &labels,
        )
        .expect("every kind and outcome is there from the start")
    }

    fn active_slots(&self) -> f64 {
        metric_value(
            &self.metrics.render(),
            "http_client_pool_active_connections",
            r#"client="inventory""#,
        )
        .unwrap()
    }

    async fn wait_for(&self, what: &str, condition: impl Fn(&Self) -> bool) {
        let started = Instant::now();
        while !condition(self) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "waited for {what}"
            );
            tokio::time::sleep(MS(5)).await;
        }
    }
}

#[tokio::test]
async fn a_slow_first_attempt_gets_a_hedge_and_the_loser_is_dropped_downstream() {
    let setup = setup(8, policy(), RetryBudget::default()).await;
    setup.learn().await;
    assert_eq!(setup.attempts("first", "won"), 30.0);
    setup.downstream.stall_next.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let reply = setup
        .get(Duration::from_secs(1))
        .await
        .expect("the hedge answers");
    let took = started.elapsed();
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        took < MS(300),
        "answered after {took:?}, the straggler stalls {STALL:?}"
    );
    assert_eq!(setup.attempts("hedge", "won"), 1.0);
    assert_eq!(setup.attempts("first", "lost"), 1.0);
    // The straggler was dropped: its connection closed, its handler cancelled.
    setup
        .wait_for("the downstream dropped the straggler", |s| {
            s.downstream.abandoned.load(Ordering::SeqCst) == 1
        })
        .await;
    setup
        .wait_for("every slot is back", |s| s.active_slots() == 0.0)
        .await;
}

#[tokio::test]
async fn a_hedge_is_not_sent_when_what_is_left_cannot_cover_an_attempt() {
    let setup = setup(8, policy(), RetryBudget::default()).await;
    setup.learn().await;
    setup.downstream.stall_next.store(true, Ordering::SeqCst);
    // 30 ms: at the hedge's delay (about 11 ms) less than the 20 ms an extra attempt
    // needs at the least is left (after the 5 ms reserve).
    let err = setup
        .get(MS(30))
        .await
        .expect_err("the straggler runs out of budget");
    assert!(matches!(err.kind(), CallErrorKind::Deadline(_)), "{err:?}");
    assert_eq!(setup.attempts("hedge", "refused_deadline"), 1.0);
    assert_eq!(
        setup.attempts("hedge", "won")
            + setup.attempts("hedge", "lost")
            + setup.attempts("hedge", "cut"),
        0.0
    );
    assert_eq!(
        setup.downstream.received.load(Ordering::SeqCst),
        31,
        "no second request"
    );
}

#[tokio::test]
async fn without_the_deadline_rule_the_same_hedge_is_sent() {
    let mut blind = policy();
    blind.deadline_aware = false;
    let setup = setup(8, blind, RetryBudget::default()).await;
    setup.learn().await;
    setup.downstream.stall_next.store(true, Ordering::SeqCst);
    let answer = setup.get(MS(30)).await;
    // The hedge went out with about 14 ms left for a 10 ms call: it may just make it,
    // or be cut with the first. Either way it was sent, which the rule would not do.
    assert_eq!(setup.attempts("hedge", "refused_deadline"), 0.0);
    assert_eq!(
        setup.attempts("hedge", "won")
            + setup.attempts("hedge", "lost")
            + setup.attempts("hedge", "cut"),
        1.0,
        "{answer:?}"
    );
    assert_eq!(setup.downstream.received.load(Ordering::SeqCst), 32);
}

#[tokio::test]
async fn a_hedge_needs_a_token_of_the_retry_budget() {
    let mut empty = RetryBudget::default();
    empty.ratio = 0.0;
    empty.floor_per_s = 0.0;
    empty.cap = 0.0;
    let setup = setup(8, policy(), empty).await;
    setup.learn().await;
    setup.downstream.stall_next.store(true, Ordering::SeqCst);
    let _ = setup.get(MS(300)).await;
    assert_eq!(setup.attempts("hedge", "refused_budget"), 1.0);
    assert_eq!(setup.downstream.received.load(Ordering::SeqCst), 31);
}

#[tokio::test]
async fn a_hedge_that_would_wait_for_a_slot_is_not_sent() {
    // One slot: the straggler holds it.
    let setup = setup(1, policy(), RetryBudget::default()).await;
    setup.learn().await;
    setup.downstream.stall_next.store(true, Ordering::SeqCst);
    let _ = setup.get(MS(300)).await;
    assert_eq!(setup.attempts("hedge", "no_slot"), 1.0);
    assert_eq!(setup.downstream.received.load(Ordering::SeqCst), 31);
    setup
        .wait_for("the one slot is back", |s| s.active_slots() == 0.0)
        .await;
}

#[tokio::test]
async fn a_post_is_hedged_only_when_it_is_safe_to_send_twice() {
    let setup = setup(8, policy(), RetryBudget::default()).await;
    setup.learn().await;
    let deadline = || Deadline::after(MS(300));
    let post = |key: Option<&'static str>| {
        let mut request = setup.client.request(Method::POST, "/item");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let deadline = deadline();
        async move { request.send(&deadline).await }
    };
    setup.downstream.stall_next.store(true, Ordering::SeqCst);
    let plain = post(None).await;
    // Cut after it was sent, a write may still be acted on: unknown, not "not written".
    assert!(
        matches!(
            plain.as_ref().map_err(|e| e.kind()),
            Err(CallErrorKind::OutcomeUnknown)
        ),
        "{plain:?}"
    );
    assert_eq!(
        setup.downstream.received.load(Ordering::SeqCst),
        31,
        "not hedged"
    );
    setup.downstream.stall_next.store(true, Ordering::SeqCst);
    let keyed = post(Some("order-17")).await.expect("the hedge answers");
    assert_eq!(keyed.status, StatusCode::OK);
    assert_eq!(setup.attempts("hedge", "won"), 1.0);
}

#[tokio::test]
async fn a_503_is_retried_once_for_a_get_and_never_for_a_post_without_a_key() {
    let setup = setup(8, policy(), RetryBudget::default()).await;
    setup
        .downstream
        .unavailable_next
        .store(true, Ordering::SeqCst);
    let get = setup.get(MS(500)).await.expect("the retry answers");
    assert_eq!(get.status, StatusCode::OK);
    assert_eq!(setup.attempts("retry", "won"), 1.0);
    assert_eq!(setup.attempts("first", "lost"), 1.0);
    setup
        .downstream
        .unavailable_next
        .store(true, Ordering::SeqCst);
    let post = setup
        .client
        .request(Method::POST, "/item")
        .send(&Deadline::after(MS(500)))
        .await;
    assert!(
        matches!(
            post.as_ref().map_err(|e| e.kind()),
            Err(CallErrorKind::DownstreamOverloaded { .. })
        ),
        "{post:?}"
    );
    assert_eq!(
        setup.attempts("retry", "won"),
        1.0,
        "the POST was not retried"
    );
}
