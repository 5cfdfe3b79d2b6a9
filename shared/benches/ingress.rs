//! What the ingress layer costs per request, against no layer and against
//! `tower_http::timeout::TimeoutLayer` (a fixed timeout: the usual alternative).
//!
//! `cargo bench -p deadline-propagation --bench ingress`. Each iteration sends one request through an
//! axum router with a trivial handler, in-process (no network), so the numbers are the
//! layer's own overhead: header parsing, the clamp, the extensions, the timer, and the
//! `Server-Timing` header.

use std::hint::black_box;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy};
use http::{Request, StatusCode};
use tower::ServiceExt;

async fn plain() -> &'static str {
    "ok"
}

async fn with_deadline(deadline: Deadline) -> &'static str {
    black_box(deadline.remaining());
    "ok"
}

fn request() -> Request<Body> {
    Request::get("/")
        .header("x-request-timeout-ms", "700")
        .body(Body::empty())
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let policy = DeadlinePolicy::new(Duration::from_millis(2000), Duration::from_millis(1000));
    let metrics = Metrics::new("bench");

    let routers = [
        ("no layer", Router::new().route("/", get(plain))),
        (
            "tower_http TimeoutLayer",
            Router::new().route("/", get(plain)).layer(
                tower_http::timeout::TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    Duration::from_millis(700),
                ),
            ),
        ),
        (
            "DeadlineLayer",
            Router::new()
                .route("/", get(with_deadline))
                .route_layer(DeadlineLayer::new(policy)),
        ),
        (
            "DeadlineLayer + metrics",
            Router::new()
                .route("/", get(with_deadline))
                .route_layer(DeadlineLayer::new(policy).with_metrics(&metrics)),
        ),
    ];

    let mut group = c.benchmark_group("ingress");
    for (name, router) in routers {
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter(|| {
                let router = router.clone();
                async move {
                    let response = router.oneshot(request()).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    black_box(response);
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
