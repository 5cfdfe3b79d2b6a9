//! What a downstream sends is input, and a downstream that writes makes the caller's
//! answer a promise about it too. Real sockets on port 0: downstreams that misbehave
//! (a `Server-Timing` past what a duration holds, a body that never ends, their own
//! `outcome-unknown`) and one that writes, whose store is the system of record the
//! caller's answer is checked against.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::routing::{get, post};
use deadline_propagation::client::{BudgetedClient, CallErrorKind, ClientConfig};
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Downstream, Problem};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// A server on a free loopback port; aborted when dropped.
struct Running(tokio::task::JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn serve(router: Router) -> (String, Running) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (url, Running(task))
}

fn ledger() -> Downstream {
    Downstream::new("ledger").unwrap()
}

fn client(url: &str, configure: impl FnOnce(&mut ClientConfig)) -> BudgetedClient {
    let mut config = ClientConfig::new(ledger(), url);
    configure(&mut config);
    BudgetedClient::new(config).unwrap()
}

/// `Duration::from_secs_f64` panics on a finite float past what a duration holds; the
/// client learns from the header on every answer, so a downstream could make every
/// call of its caller panic.
#[tokio::test]
async fn a_server_timing_total_past_what_a_duration_holds_is_ignored() {
    let router = Router::new().route(
        "/entries",
        get(|| async { ([("server-timing", "total;dur=1e30")], "{}") }),
    );
    let (url, _downstream) = serve(router).await;
    let client = client(&url, |_| {});
    for _ in 0..2 {
        let reply = client
            .request(Method::GET, "/entries")
            .send(&Deadline::after(MS(2000)))
            .await
            .expect("a 200 whatever its Server-Timing says");
        assert_eq!(reply.status, StatusCode::OK);
    }
}

/// A raw HTTP/1.1 server: `/endless` answers 200 with a chunked body that never ends,
/// `/small` answers `{}` and keeps the connection. It counts the connections it
/// accepted and notifies `closed` when a client closes one mid-body.
async fn endless_server() -> (String, Arc<AtomicUsize>, Arc<Notify>, Running) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(Notify::new());
    let task = tokio::spawn({
        let (accepted, closed) = (Arc::clone(&accepted), Arc::clone(&closed));
        async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                accepted.fetch_add(1, Ordering::SeqCst);
                let closed = Arc::clone(&closed);
                tokio::spawn(async move {
                    loop {
                        let mut head = Vec::new();
                        while !head.ends_with(b"\r\n\r\n") {
                            let mut byte = [0u8; 1];
                            if socket.read_exact(&mut byte).await.is_err() {
                                return;
                            }
                            head.push(byte[0]);
                        }
                        if head.starts_with(b"GET /small") {
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
                            socket.write_all(answer).await.unwrap();
                            continue;
                        }
                        let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                        socket.write_all(head).await.unwrap();
                        let chunk = [b'x'; 16 * 1024];
                        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
                        framed.extend_from_slice(&chunk);
                        framed.extend_from_slice(b"\r\n");
                        while socket.write_all(&framed).await.is_ok() {}
                        closed.notify_one();
                        return;
                    }
                });
            }
        }
    });
    (url, accepted, closed, Running(task))
}

/// The peak resident set of this process, from the kernel.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn an_endless_body_ends_at_the_limit_as_a_502_and_its_connection_is_not_reused() {
    let (url, accepted, closed, _downstream) = endless_server().await;
    let limit = 256 * 1024;
    let client = client(&url, |c| c.max_body = limit);
    let before = peak_rss_kib();

    let deadline = Deadline::after(MS(10_000));
    let err = client
        .request(Method::GET, "/endless")
        .send(&deadline)
        .await
        .expect_err("a body longer than the limit");
    assert_eq!(err.kind(), CallErrorKind::TooLarge(limit), "{err:?}");
    assert!(
        deadline.remaining() > MS(5_000),
        "refused as the limit passed, not at the deadline"
    );
    let problem = Problem::from(err);
    assert_eq!(problem.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(problem.stage(), Some(ledger().call()));
    // Memory: the read stopped at the limit (an unbounded read took gigabytes).
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "peak RSS grew by {grown} KiB");

    // The connection was closed, not pooled: the downstream sees its writes fail, and
    // the next call comes on a new connection.
    tokio::time::timeout(Duration::from_secs(10), closed.notified())
        .await
        .expect("the client closed the connection of the body it refused");
    let reply = client
        .request(Method::GET, "/small")
        .send(&Deadline::after(MS(2000)))
        .await
        .expect("a small body");
    assert_eq!(&reply.body[..], b"{}");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_body_announced_longer_than_the_limit_is_refused_before_it_is_read() {
    let router = Router::new().route("/big", get(|| async { vec![b'x'; 4096] }));
    let (url, _downstream) = serve(router).await;
    let client = client(&url, |c| c.max_body = 1024);
    let err = client
        .request(Method::GET, "/big")
        .send(&Deadline::after(MS(2000)))
        .await
        .expect_err("4 KiB announced, 1 KiB allowed");
    assert_eq!(err.kind(), CallErrorKind::TooLarge(1024));
    // At the limit exactly is allowed.
    let client = self::client(&url, |c| c.max_body = 4096);
    let deadline = Deadline::after(MS(2000));
    let reply = client.request(Method::GET, "/big").send(&deadline).await;
    assert_eq!(reply.expect("4 KiB of 4 KiB").body.len(), 4096);
}

/// A downstream's own `outcome-unknown` travels up as unknown: a 502 would tell the
/// caller that nothing was written, which the downstream just said nobody knows.
#[tokio::test]
async fn a_downstreams_outcome_unknown_is_answered_as_unknown_not_as_a_502() {
    let unknown = || async {
        let problem = Problem::outcome_unknown(deadline_propagation::Stage::Db);
        axum::response::IntoResponse::into_response(problem)
    };
    let router = Router::new().route("/entries", get(unknown).post(unknown));
    let (url, _downstream) = serve(router).await;
    let client = client(&url, |_| {});
    for method in [Method::GET, Method::POST] {
        let err = client
            .request(method.clone(), "/entries")
            .send(&Deadline::after(MS(2000)))
            .await
            .expect_err("a 500");
        assert_eq!(err.kind(), CallErrorKind::OutcomeUnknown, "{method}");
        let problem = Problem::from(err);
        assert_eq!(problem.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(problem.stage(), Some(ledger().call()));
    }
}

/// The downstream that writes: `POST /entries` appends to its store at once (its system
/// of record), then answers after `answer_after`; `GET /slow` answers after 10 s.
#[derive(Clone)]
struct Ledger {
    store: Arc<std::sync::Mutex<Vec<String>>>,
    answer_after: Duration,
}

async fn write_entry(State(ledger): State<Ledger>, body: String) -> StatusCode {
    ledger.store.lock().unwrap().push(body);
    tokio::time::sleep(ledger.answer_after).await;
    StatusCode::CREATED
}

async fn spawn_ledger(answer_after: Duration) -> (Ledger, String, Running) {
    let ledger = Ledger {
        store: Arc::default(),
        answer_after,
    };
    let router = Router::new()
        .route("/entries", post(write_entry))
        .route("/slow", get(|| tokio::time::sleep(Duration::from_secs(10))))
        .with_state(ledger.clone());
    let (url, running) = serve(router).await;
    (ledger, url, running)
}

/// The caller: `POST /pay?write` writes an entry to the ledger, `?read` reads from it
/// (slowly), `?write&read` does both, under the deadline layer. Its answers are what the test checks
/// against the ledger's store.
async fn spawn_caller(ledger_url: &str) -> (String, Running) {
    let client = client(ledger_url, |_| {});
    let pay = |State(client): State<BudgetedClient>,
               deadline: Deadline,
               axum::extract::RawQuery(query): axum::extract::RawQuery| async move {
        let query = query.unwrap_or_default();
        if query.contains("write") {
            let entry = client.request(Method::POST, "/entries").body("10 EUR");
            entry.send(&deadline).await?;
        }
        if query.contains("read") {
            client.request(Method::GET, "/slow").send(&deadline).await?;
        }
        Ok::<_, Problem>(StatusCode::CREATED)
    };
    let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(5000, 1000));
    let router = Router::new()
        .route("/pay", post(pay))
        .route_layer(layer)
        .with_state(client);
    serve(router).await
}

async fn pay(caller: &str, budget_ms: u64, query: &str) -> (StatusCode, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(format!("{caller}/pay{query}"))
        .header("x-request-timeout-ms", budget_ms.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// A write on the wire at the deadline may still be acted on: the caller waits a
/// grace for the downstream's answer instead of cutting it with a 504 ("nothing was
/// written"). An answer in the grace is the truth (201); none is `outcome-unknown`.
#[tokio::test]
async fn a_write_cut_at_the_deadline_is_never_answered_as_nothing_written() {
    // The ledger writes at once and answers 100 ms past the caller's 300 ms budget.
    let (ledger, url, _ledger) = spawn_ledger(MS(400)).await;
    let (caller, _caller) = spawn_caller(&url).await;
    let (status, body) = pay(&caller, 300, "?write").await;
    assert_eq!(ledger.store.lock().unwrap().len(), 1, "the ledger wrote it");
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The ledger never answers in time: nobody can know, and the answer says so.
    let (ledger, url, _ledger) = spawn_ledger(MS(10_000)).await;
    let (caller, _caller) = spawn_caller(&url).await;
    let (status, body) = pay(&caller, 300, "?write").await;
    assert_eq!(ledger.store.lock().unwrap().len(), 1, "the ledger wrote it");
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["type"], "urn:problem:outcome-unknown", "{body}");
    assert_eq!(body["stage"], "ledger", "{body}");
}

/// Once a downstream has acted on a write, a later step's 504 would say that nothing
/// was written: the ingress answers `outcome-unknown` instead.
#[tokio::test]
async fn a_later_steps_504_after_a_write_is_answered_as_unknown() {
    let (ledger, url, _ledger) = spawn_ledger(Duration::ZERO).await;
    let (caller, _caller) = spawn_caller(&url).await;
    let (status, body) = pay(&caller, 300, "?write&read").await;
    assert_eq!(ledger.store.lock().unwrap().len(), 1, "the ledger wrote it");
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["type"], "urn:problem:outcome-unknown", "{body}");

    // Without the write, the same slow read is a plain 504: nothing was written.
    let (status, body) = pay(&caller, 300, "?read").await;
    assert_eq!(
        ledger.store.lock().unwrap().len(),
        1,
        "nothing more written"
    );
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
}

/// A write whose answer proves nothing (a 500 that is not the contract's 502, 503 or
/// 504) may have been acted on; a refused connection carried no byte and proves it was
/// not.
#[tokio::test]
async fn a_writes_500_is_unknown_and_its_refused_connection_is_not() {
    let hits = Arc::new(AtomicUsize::new(0));
    let failing = Router::new().route(
        "/entries",
        post({
            let hits = Arc::clone(&hits);
            move || async move {
                hits.fetch_add(1, Ordering::SeqCst);
                (StatusCode::INTERNAL_SERVER_ERROR, "broken")
            }
        }),
    );
    let (url, _downstream) = serve(failing).await;
    let err = client(&url, |_| {})
        .request(Method::POST, "/entries")
        .send(&Deadline::after(MS(2000)))
        .await
        .expect_err("a 500");
    assert_eq!(err.kind(), CallErrorKind::OutcomeUnknown);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "never sent twice");
    // Marked read-only, the same 500 proves nothing was written: a 502.
    let err = client(&url, |_| {})
        .request(Method::POST, "/entries")
        .read_only()
        .send(&Deadline::after(MS(2000)))
        .await
        .expect_err("a 500");
    assert_eq!(Problem::from(err).status(), StatusCode::BAD_GATEWAY);

    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = client(&refused, |_| {})
        .request(Method::POST, "/entries")
        .send(&Deadline::after(MS(2000)))
        .await
        .expect_err("nobody listens");
    assert_eq!(err.kind(), CallErrorKind::Unreachable);
}
