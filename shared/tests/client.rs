//! The budgeted client against real sockets, through the public API: what a
//! downstream's 503 becomes, a client named by configuration (`inventory`) sending any
//! request and answering in its own stages behind the deadline layer, a caller that goes
//! away, a full bulkhead, a body that never comes, and the one retry. The gauges and
//! counters are read from the exposition `/metrics` serves.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::routing::{get, post};
use deadline_propagation::client::{BudgetedClient, CallErrorKind, ClientConfig};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::testing::metric_value;
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Downstream, Problem};
use tokio::net::TcpListener;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// A server on a free loopback port; aborted when dropped.
struct Running(tokio::task::JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves `router` on a free loopback port; returns its base URL.
async fn serve_on_port_0(router: Router) -> (String, Running) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (url, Running(task))
}

/// `GET /metrics` at `base`, as a scraper reads it.
async fn scrape(base: &str) -> String {
    let url = format!("{base}/metrics");
    reqwest::get(&url).await.unwrap().text().await.unwrap()
}

/// The sum of the samples of `name` that carry every label in `wanted`.
fn sum(exposition: &str, name: &str, wanted: &[(&str, &str)]) -> Option<f64> {
    exposition
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(labelled) => labelled.rsplit_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let all = wanted
                .iter()
                .all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")));
            all.then(|| value.split_whitespace().next()?.parse::<f64>().ok())?
        })
        .reduce(|a, b| a + b)
}

fn named_client(
    name: Downstream,
    base_url: &str,
    max_connections: u32,
    metrics: &Metrics,
) -> BudgetedClient {
    let mut config = ClientConfig::new(name, base_url);
    config.max_connections = max_connections;
    config.pending_max = 100_000;
    config.acquire_timeout = Duration::from_secs(10);
    config.idle_timeout = Duration::from_secs(1);
    BudgetedClient::new(config)
        .expect("the client builds")
        .with_metrics(metrics)
}

/// A downstream that is overloaded: 503 with the `Retry-After` named in the path.
fn overloaded_downstream() -> Router {
    let answer = |retry_after: Option<&'static str>| {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert(header::RETRY_AFTER, value.parse().unwrap());
        }
        (StatusCode::SERVICE_UNAVAILABLE, headers, "busy")
    };
    Router::new()
        .route("/seven", get(move || async move { answer(Some("7")) }))
        .route("/none", get(move || async move { answer(None) }))
        .route("/garbage", get(move || async move { answer(Some("soon")) }))
}

#[tokio::test]
async fn a_downstream_503_is_passed_on_with_its_own_retry_after() {
    let (url, _downstream) = serve_on_port_0(overloaded_downstream()).await;
    let client = named_client(
        Downstream::new("catalog").unwrap(),
        &url,
        4,
        &Metrics::new("test"),
    );
    // A missing or unreadable Retry-After gets the default of one second.
    for (path, expected) in [("/seven", "7"), ("/none", "1"), ("/garbage", "1")] {
        let err = client
            .request(Method::GET, path)
            .send(&Deadline::after(Duration::from_secs(5)))
            .await
            .expect_err("the downstream answers 503");
        assert!(
            matches!(err.kind(), CallErrorKind::DownstreamOverloaded { .. }),
            "{path}: {err:?}"
        );
        let response = axum::response::IntoResponse::into_response(Problem::from(err));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], expected, "{path}");
    }
}

fn inventory() -> Downstream {
    Downstream::new("inventory").expect("a valid name")
}

/// A downstream that takes far longer than any budget here to answer.
fn slow_downstream(started: Arc<tokio::sync::Notify>) -> Router {
    let handler = move || {
        let started = Arc::clone(&started);
        async move {
            started.notify_one();
            tokio::time::sleep(Duration::from_secs(30)).await;
            "too late"
        }
    };
    Router::new().route("/check", axum::routing::post(handler))
}

#[tokio::test]
async fn a_client_named_inventory_answers_its_504_and_its_metrics_in_its_own_name() {
    let metrics = Metrics::new("test");
    let started = Arc::new(tokio::sync::Notify::new());
    let (url, _downstream) = serve_on_port_0(slow_downstream(Arc::clone(&started))).await;
    let client = named_client(inventory(), &url, 4, &metrics);
    // The service in front: its handler spends the request's deadline on one call.
    async fn check(
        State(client): State<BudgetedClient>,
        deadline: Deadline,
    ) -> Result<&'static str, Problem> {
        // A check changes nothing: cut at the deadline, nothing can have been written.
        let call = client.request(Method::POST, "/check").read_only();
        call.json(&serde_json::json!({"sku": "SKU-00001"}))
            .send(&deadline)
            .await?;
        Ok("checked")
    }
    let front = Router::new()
        .route("/check", post(check))
        .with_state(client);
    let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(2000, 1000));
    let (front_url, _front) =
        serve_on_port_0(deadline_propagation::instrument(front, layer, &metrics)).await;

    let begun = tokio::time::Instant::now();
    let response = reqwest::Client::new()
        .post(format!("{front_url}/check"))
        .header("x-request-timeout-ms", "300")
        .send()
        .await
        .unwrap();
    let took = begun.elapsed();
    // The request did reach the downstream: this is a timeout of the call, not of a
    // refusal before it.
    tokio::time::timeout(MS(1), started.notified())
        .await
        .expect("the downstream got the request");
    assert!(took >= MS(300) && took < MS(1500), "cut after {took:?}");
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(problem["stage"], "inventory", "{problem}");
    assert_eq!(problem["budget_ms"], 300);

    let text = scrape(&front_url).await;
    let value = |name: &str, labels: &[(&str, &str)]| sum(&text, name, labels).unwrap_or(0.0);
    let inventory_label = [("client", "inventory")];
    assert_eq!(
        value(
            "http_client_requests_seconds_count",
            &[("client", "inventory"), ("status", "timeout")]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        value("http_client_pool_acquire_seconds_count", &inventory_label),
        1.0
    );
    for stage in ["inventory", "inventory_pool"] {
        assert!(
            sum(&text, "deadline_exceeded_total", &[("stage", stage)]).is_some(),
            "the {stage} series exists from start-up"
        );
    }
    assert_eq!(
        value("deadline_exceeded_total", &[("stage", "inventory")]),
        1.0
    );
    assert_eq!(
        value(
            "deadline_remaining_seconds_count",
            &[("stage", "inventory")]
        ),
        1.0
    );
    assert_eq!(
        value("deadline_exceeded_total", &[("stage", "catalog")]),
        0.0
    );
    // Nothing of this client is reported as the catalog's.
    let catalog_series: Vec<_> = text
        .lines()
        .filter(|line| line.contains(r#"client="catalog""#))
        .collect();
    assert!(catalog_series.is_empty(), "{catalog_series:?}");
}

/// What a downstream received: method, budget header, content type and body.
type Received = (Method, Option<u64>, Option<String>, bytes::Bytes);

/// A caller that goes away (its client hung up, so the handler's future and the call in
/// it were dropped) still leaves its call in the histogram, as `cancelled`, with the
/// time the call ran. Otherwise a downstream slower than its callers' patience would
/// drop out of the call's figures and read as a fast one.
#[tokio::test]
async fn a_call_whose_caller_goes_away_is_timed_as_cancelled() {
    let metrics = Metrics::new("test");
    let started = Arc::new(tokio::sync::Notify::new());
    let (url, _downstream) = serve_on_port_0(slow_downstream(Arc::clone(&started))).await;
    let client = named_client(inventory(), &url, 4, &metrics);
    let deadline = Deadline::after(MS(10_000));

    let call = client
        .request(Method::POST, "/check")
        .json(&serde_json::json!({"sku": "SKU-00001"}))
        .send(&deadline);
    // The caller waits until the downstream has the request, then 50 ms more, then
    // gives up: the call's future is dropped.
    let gave_up = async {
        started.notified().await;
        tokio::time::sleep(MS(50)).await;
    };
    tokio::select! {
        _ = call => panic!("the downstream answers only after 30 s"),
        () = gave_up => {}
    }

    let text = metrics.render();
    let cancelled = [("client", "inventory"), ("status", "cancelled")];
    assert_eq!(
        sum(&text, "http_client_requests_seconds_count", &cancelled),
        Some(1.0),
        "{text}"
    );
    let seconds = sum(&text, "http_client_requests_seconds_sum", &cancelled).unwrap();
    assert!(
        seconds >= 0.05,
        "the call ran at least 50 ms, timed {seconds} s"
    );
}

#[tokio::test]
async fn a_post_arrives_with_its_method_body_headers_and_a_smaller_budget() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Received>();
    let recorder = axum::routing::any(
        move |method: Method, headers: HeaderMap, body: bytes::Bytes| {
            let tx = tx.clone();
            async move {
                let budget = headers
                    .get("x-request-timeout-ms")
                    .and_then(|v| v.to_str().ok()?.parse().ok());
                let content_type = headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| Some(v.to_str().ok()?.to_owned()));
                let _ = tx.send((method, budget, content_type, body));
                (
                    StatusCode::ACCEPTED,
                    axum::Json(serde_json::json!({"ok": true})),
                )
            }
        },
    );
    let (url, _downstream) = serve_on_port_0(Router::new().route("/check", recorder)).await;
    let client = named_client(inventory(), &url, 4, &Metrics::new("test"));

    let reply = client
        .request(Method::POST, "/check")
        .header("x-request-timeout-ms", "60000") // owned by the client: replaced
        .json(&serde_json::json!({"sku": "SKU-00001", "quantity": 2}))
        .send(&Deadline::after(MS(800)))
        .await
        .expect("a 202 is a success");
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    assert_eq!(reply.json::<serde_json::Value>().unwrap()["ok"], true);

    let (method, budget, content_type, body) = rx.recv().await.expect("one request arrived");
    assert_eq!(method, Method::POST);
    let budget = budget.expect("the budget header is sent");
    assert!(
        budget > 0 && budget < 800,
        "sent {budget} ms of an 800 ms budget"
    );
    assert_eq!(content_type.as_deref(), Some("application/json"));
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body, serde_json::json!({"sku": "SKU-00001", "quantity": 2}));
    assert!(rx.try_recv().is_err(), "exactly one request");

    // A header that is not valid HTTP fails before any I/O, as our own mistake.
    let err = client
        .request(Method::PUT, "/check")
        .header("x-bad", "line\nbreak")
        .send(&Deadline::after(MS(800)))
        .await
        .expect_err("an invalid header value");
    assert_eq!(err.kind(), CallErrorKind::Request, "{err:?}");
    assert_eq!(
        Problem::from(err).status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert!(rx.try_recv().is_err(), "nothing was sent");
}

/// The `inventory` client's slots in use, as `/metrics` shows them.
fn active_slots(metrics: &Metrics) -> Option<f64> {
    metric_value(
        &metrics.render(),
        "http_client_pool_active_connections",
        r#"client="inventory""#,
    )
}

/// An `inventory` client with one slot and no room in its queue, and a call in a task
/// of its own holding that slot at a downstream that does not answer. Keep the returned
/// server and task alive for as long as the slot must be held.
async fn full_inventory(
    metrics: &Metrics,
) -> (BudgetedClient, Running, tokio::task::JoinHandle<()>) {
    let started = Arc::new(tokio::sync::Notify::new());
    let (url, downstream) = serve_on_port_0(slow_downstream(Arc::clone(&started))).await;
    let mut config = named_client(inventory(), &url, 1, metrics).config().clone();
    config.pending_max = 0;
    let client = BudgetedClient::new(config).unwrap().with_metrics(metrics);
    let holder = {
        let client = client.clone();
        tokio::spawn(async move {
            let held = client.request(Method::POST, "/check").health_check();
            let _ = held.send(&Deadline::after(Duration::from_secs(5))).await;
        })
    };
    // The downstream has the call, so the slot is taken.
    started.notified().await;
    assert_eq!(active_slots(metrics), Some(1.0));
    (client, downstream, holder)
}

#[tokio::test]
async fn a_full_inventory_bulkhead_refuses_with_503_in_the_inventory_pool_stage() {
    let metrics = Metrics::new("test");
    let (client, _downstream, holder) = full_inventory(&metrics).await;

    let err = client
        .request(Method::POST, "/check")
        .send(&Deadline::after(Duration::from_secs(5)))
        .await
        .expect_err("no slot and no room in the queue");
    let response = axum::response::IntoResponse::into_response(Problem::from(err));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key(header::RETRY_AFTER));
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["stage"], "inventory_pool", "{problem}");
    let rejected = metric_value(
        &metrics.render(),
        "http_client_pool_rejections_total",
        r#"client="inventory",reason="queue_full""#,
    );
    assert_eq!(rejected, Some(1.0));
    holder.abort();
}

/// A downstream that sends its headers at once and then never its body: the call keeps
/// its slot while the body is awaited (a slot freed at the headers would let more calls
/// pile onto a downstream still busy with this one), and the deadline covers the body,
/// so the call ends at its budget, closing the connection.
#[tokio::test]
async fn a_body_that_never_comes_holds_the_slot_and_is_cut_at_the_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let headers_sent = Arc::new(tokio::sync::Notify::new());
    let server = tokio::spawn({
        let headers_sent = Arc::clone(&headers_sent);
        async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                socket.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            let answer =
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n";
            socket.write_all(answer).await.unwrap();
            headers_sent.notify_one();
            // No body: wait until the client closes the connection.
            let mut rest = Vec::new();
            let _ = socket.read_to_end(&mut rest).await;
        }
    });
    let metrics = Metrics::new("test");
    let client = named_client(inventory(), &url, 1, &metrics);
    let deadline = Deadline::after(MS(300));
    let call = tokio::spawn({
        let (client, deadline) = (client.clone(), deadline.clone());
        async move {
            let reply = client.request(Method::GET, "/stock").send(&deadline).await;
            reply.map(|reply| reply.body)
        }
    });
    headers_sent.notified().await;
    // Read the slot first, the clock second: a free slot seen before the deadline is a
    // slot freed before the body came.
    loop {
        let active = active_slots(&metrics);
        if tokio::time::Instant::now() >= deadline.instant() {
            break;
        }
        assert_eq!(
            active,
            Some(1.0),
            "the slot was freed while the body was still to come"
        );
        tokio::time::sleep(MS(5)).await;
    }
    // Bounded, so that a deadline that misses the body fails here instead of hanging.
    let result = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ends at its deadline, body or not")
        .unwrap();
    assert!(
        matches!(
            result.as_ref().map_err(|e| e.kind()),
            Err(CallErrorKind::Deadline(_))
        ),
        "{result:?}"
    );
    assert_eq!(active_slots(&metrics), Some(0.0));
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the client closed the connection")
        .unwrap();
}

/// Only a refused connection is retried: it carried no byte of the request. A 500
/// came from a downstream that may have acted on the call, so it is passed on as a
/// failure after exactly one request, for a `POST` as for any call.
#[tokio::test]
async fn a_500_is_not_retried_and_a_refused_connection_is_retried_once() {
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failing = Router::new().route(
        "/check",
        axum::routing::post({
            let hits = Arc::clone(&hits);
            move || async move {
                hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                (StatusCode::INTERNAL_SERVER_ERROR, "broken")
            }
        }),
    );
    let (url, _downstream) = serve_on_port_0(failing).await;
    let metrics = Metrics::new("test");
    let retries = |metrics: &Metrics| {
        metric_value(
            &metrics.render(),
            "http_client_retries_total",
            r#"client="inventory""#,
        )
    };
    let client = named_client(inventory(), &url, 4, &metrics);
    // A check, marked as changing nothing: its 500 proves nothing was written (for a
    // write it would be unknown: tests/downstream_answers.rs).
    let err = client
        .request(Method::POST, "/check")
        .read_only()
        .json(&serde_json::json!({"sku": "SKU-00001", "quantity": 1}))
        .send(&Deadline::after(Duration::from_secs(5)))
        .await
        .expect_err("the downstream answers 500");
    assert_eq!(Problem::from(err).status(), StatusCode::BAD_GATEWAY);
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(retries(&metrics), Some(0.0));

    // A port nobody listens on refuses the connection: one retry, then 502.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let metrics = Metrics::new("test");
    let client = named_client(inventory(), &refused_url, 4, &metrics);
    let err = client
        .request(Method::POST, "/check")
        .send(&Deadline::after(Duration::from_secs(5)))
        .await
        .expect_err("nobody listens");
    assert_eq!(Problem::from(err).status(), StatusCode::BAD_GATEWAY);
    assert_eq!(retries(&metrics), Some(1.0));
}
