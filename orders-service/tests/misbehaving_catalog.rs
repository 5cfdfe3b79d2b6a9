//! What the catalog sends is input: orders-service in front of a fake catalog that
//! misbehaves over a real socket (a raw HTTP/1.1 server, no framework to tidy its
//! answers), checked against the orders table and the kernel's view of the process.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use common::{MS, json_of, spawn_app_with};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How the fake catalog answers `GET /catalog/{sku}`.
#[derive(Clone, Copy)]
enum Misbehaviour {
    /// A good item with `Server-Timing: total;dur=1e30`.
    HugeServerTiming,
    /// 200, then a chunked body that never ends.
    EndlessBody,
    /// 500 `urn:problem:outcome-unknown`.
    OutcomeUnknown,
}

/// The fake catalog on a free loopback port; counts the connections it accepted.
async fn fake_catalog(how: Misbehaviour) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
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
                    let item = r#"{"sku":"SKU-00001","name":"Item 1","price_cents":1250}"#;
                    let problem = r#"{"type":"urn:problem:outcome-unknown","title":"Internal Server Error","status":500,"detail":"unknown","stage":"db"}"#;
                    let answer = match how {
                        Misbehaviour::HugeServerTiming => format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                             server-timing: total;dur=1e30\r\ncontent-length: {}\r\n\r\n{item}",
                            item.len()
                        ),
                        Misbehaviour::OutcomeUnknown => format!(
                            "HTTP/1.1 500 Internal Server Error\r\n\
                             content-type: application/problem+json\r\ncontent-length: {}\r\n\r\n{problem}",
                            problem.len()
                        ),
                        Misbehaviour::EndlessBody => {
                            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                        transfer-encoding: chunked\r\n\r\n";
                            if socket.write_all(head.as_bytes()).await.is_err() {
                                return;
                            }
                            let mut chunk = format!("{:x}\r\n", 64 * 1024).into_bytes();
                            chunk.extend(std::iter::repeat_n(b' ', 64 * 1024));
                            chunk.extend_from_slice(b"\r\n");
                            while socket.write_all(&chunk).await.is_ok() {}
                            return;
                        }
                    };
                    if socket.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, accepted)
}

/// The peak resident set of this process (the service runs in it), from the kernel.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024
}

#[tokio::test]
async fn a_server_timing_past_what_a_duration_holds_does_not_fail_the_order() {
    let (url, _) = fake_catalog(Misbehaviour::HugeServerTiming).await;
    let app = spawn_app_with(move |c| c.catalog_url = url).await;
    // Twice: the first answer teaches the client its wire estimate, the second uses it.
    for _ in 0..2 {
        let response = app.order("SKU-00001", 1, Some(2000)).await;
        let status = response.status();
        assert_eq!(status, StatusCode::CREATED, "{}", json_of(response).await);
    }
    assert_eq!(app.order_rows_for("SKU-00001").await, 2);
}

#[tokio::test]
async fn an_endless_catalog_body_is_a_prompt_502_with_flat_memory() {
    let (url, accepted) = fake_catalog(Misbehaviour::EndlessBody).await;
    let app = spawn_app_with(move |c| c.catalog_url = url).await;
    let before = peak_rss_mib();

    let started = Instant::now();
    let response = app.order("SKU-00001", 1, Some(1000)).await;
    let took = started.elapsed();
    let problem = json_of(response).await;
    assert_eq!(problem["status"], 502, "{problem}");
    assert_eq!(problem["stage"], "catalog", "{problem}");
    // Refused when the limit passed, well before the deadline (an unbounded read ran
    // to it, and past it).
    assert!(took < MS(900), "answered after {took:?}");
    let grown = peak_rss_mib().saturating_sub(before);
    assert!(grown < 64, "peak RSS grew by {grown} MiB");
    assert_eq!(app.order_rows_for("SKU-00001").await, 0, "nothing written");

    // The refused body's connection is not reused: the next call opens another.
    let _ = app.order("SKU-00001", 1, Some(1000)).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_catalogs_outcome_unknown_is_answered_as_unknown_not_as_nothing_written() {
    let (url, _) = fake_catalog(Misbehaviour::OutcomeUnknown).await;
    let app = spawn_app_with(move |c| c.catalog_url = url).await;
    let response = app.order("SKU-00001", 1, Some(2000)).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let problem = json_of(response).await;
    assert_eq!(problem["type"], "urn:problem:outcome-unknown", "{problem}");
    assert_eq!(problem["stage"], "catalog", "{problem}");
    assert_eq!(app.order_rows_for("SKU-00001").await, 0);
}
