//! The keep-alive race: a pooled connection reused just as the catalog closes it.
//!
//! hyper's header read timeout also runs while a keep-alive connection sits idle
//! (`service_kit::server`: 5 s on catalog-service), so the server closes idle connections
//! after that long. A client that keeps idle connections longer may send a request on a
//! connection the server is closing at that very moment: the request is lost, the
//! connection ends without an answer, and the order fails with 502 although the catalog
//! is healthy. On a real server the window is a few microseconds wide; the stand-in
//! below makes the client lose that race every time it reuses a connection too late.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{MS, spawn_app_with};
use orders_service::Config;
use reqwest::StatusCode;
use service_kit::server::ServerOptions;
use test_support::wait_until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// How long the stand-in keeps an idle connection: shorter than catalog-service's 5 s,
/// so the test is quick, and longer than the client's idle timeout must be.
const SERVER_IDLE_CLOSE: Duration = Duration::from_secs(3);

/// A catalog stand-in speaking just enough HTTP/1.1: it answers every request on a
/// keep-alive connection, except one that arrives after the connection has been idle
/// for [`SERVER_IDLE_CLOSE`]: that one it reads and drops, as a server whose idle
/// timer fires while the request is in flight does.
struct ClosingCatalog {
    url: String,
    connections: Arc<AtomicUsize>,
    last_answer: Arc<Mutex<Option<Instant>>>,
}

impl ClosingCatalog {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let this = Self {
            url: format!("http://{}", listener.local_addr().unwrap()),
            connections: Arc::default(),
            last_answer: Arc::default(),
        };
        let (connections, last_answer) = (this.connections.clone(), this.last_answer.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_connection(stream, last_answer.clone()));
            }
        });
        this
    }

    /// How long since the last answer: the idle time of the connection that sent it.
    fn idle_for(&self) -> Duration {
        self.last_answer
            .lock()
            .unwrap()
            .map_or(Duration::ZERO, |at| at.elapsed())
    }
}

async fn serve_connection(mut stream: TcpStream, last_answer: Arc<Mutex<Option<Instant>>>) {
    let body = r#"{"sku":"SKU-00001","name":"Item 1","price_cents":100}"#;
    let mut idle_since: Option<Instant> = None;
    loop {
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut buf = [0; 1024];
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        if idle_since.is_some_and(|at| at.elapsed() >= SERVER_IDLE_CLOSE) {
            return; // closed with the request unanswered
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        idle_since = Some(Instant::now());
        *last_answer.lock().unwrap() = idle_since;
    }
}

#[tokio::test]
async fn a_connection_idle_longer_than_the_server_keeps_it_is_never_reused() {
    let catalog = ClosingCatalog::start().await;
    // orders-service with its default settings, except where the catalog is.
    let app = spawn_app_with(|c| c.catalog_url = catalog.url.clone()).await;
    let first = app.order("SKU-00001", 1, Some(2000)).await;
    assert_eq!(first.status(), StatusCode::CREATED);

    wait_until(
        "the catalog's connection has been idle long enough to be closed",
        SERVER_IDLE_CLOSE + MS(5000),
        || async { catalog.idle_for() >= SERVER_IDLE_CLOSE },
    )
    .await;
    let second = app.order("SKU-00001", 1, Some(2000)).await;
    let status = second.status();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        second.text().await.unwrap()
    );
    assert_eq!(
        catalog.connections.load(Ordering::SeqCst),
        2,
        "the second call opened a fresh connection"
    );
}

/// The default that the test above relies on, against the real catalog's setting.
#[test]
fn the_default_idle_timeout_is_well_below_the_catalogs_idle_close() {
    let orders = Config::for_tests("http://127.0.0.1:1", "postgres://127.0.0.1:1/none");
    let client_idle = MS(orders.catalog_pool_idle_timeout_ms);
    // catalog-service serves with the default options, so this is when it closes.
    let catalog_close = ServerOptions::default().header_read_timeout;
    assert!(
        client_idle * 2 <= catalog_close,
        "{client_idle:?} vs {catalog_close:?}"
    );
    assert!(
        client_idle < SERVER_IDLE_CLOSE,
        "the test above must exercise the default"
    );
}
