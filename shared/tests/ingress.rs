//! The ingress layer, driven through tower without a network.

use deadline_propagation::testing::metric_value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use deadline_propagation::metrics::Metrics;
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Problem, Stage};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::ServiceExt;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Reports the budget the handler was given.
async fn report_budget(deadline: Deadline) -> String {
    format!(
        "{} {}",
        deadline.budget().as_millis(),
        deadline.remaining().as_millis()
    )
}

async fn sleep_two_seconds(_deadline: Deadline) -> &'static str {
    tokio::time::sleep(Duration::from_secs(2)).await;
    "finished"
}

fn app(layer: DeadlineLayer) -> Router {
    Router::new()
        .route("/budget", get(report_budget))
        .route("/slow", get(sleep_two_seconds))
        .route_layer(layer)
}

fn policy(max_ms: u64, default_ms: u64) -> DeadlinePolicy {
    DeadlinePolicy::new(MS(max_ms), MS(default_ms))
}

async fn call(app: Router, uri: &str, budget: Option<&str>) -> (http::response::Parts, Vec<u8>) {
    let headers: Vec<_> = budget
        .map(|b| ("X-Request-Timeout-Ms", b))
        .into_iter()
        .collect();
    call_with(app, uri, &headers).await
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).expect("a JSON body")
}

#[tokio::test]
async fn a_60s_request_under_a_500ms_maximum_gives_the_handler_at_most_500ms() {
    let (parts, body) = call(
        app(DeadlineLayer::new(policy(500, 300))),
        "/budget",
        Some("60000"),
    )
    .await;
    assert_eq!(parts.status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    let (budget, remaining) = text.split_once(' ').unwrap();
    assert_eq!(budget, "500");
    assert!(remaining.parse::<u64>().unwrap() <= 500, "{text}");
}

#[tokio::test]
async fn a_request_without_the_header_gets_the_default_budget() {
    let (_, body) = call(app(DeadlineLayer::new(policy(500, 300))), "/budget", None).await;
    assert!(String::from_utf8(body).unwrap().starts_with("300 "));
}

#[tokio::test]
async fn a_malformed_budget_gets_a_400_problem_naming_the_header() {
    for bad in [
        "",
        "abc",
        "-5",
        "+5",
        "1.5",
        "1e3",
        "0x10",
        "99999999999999999999999",
    ] {
        let (parts, body) = call(
            app(DeadlineLayer::new(policy(500, 300))),
            "/budget",
            Some(bad),
        )
        .await;
        assert_eq!(parts.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(parts.headers["content-type"], "application/problem+json");
        let problem = json(&body);
        assert_eq!(problem["header"], "X-Request-Timeout-Ms", "{bad:?}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("X-Request-Timeout-Ms")
        );
    }
}

/// Calls `uri` with the given headers, which may be any budget header.
async fn call_with(
    app: Router,
    uri: &str,
    headers: &[(&str, &str)],
) -> (http::response::Parts, Vec<u8>) {
    let mut request = Request::get(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    (parts, body.collect().await.unwrap().to_bytes().to_vec())
}

#[tokio::test]
async fn a_malformed_grpc_or_envoy_budget_gets_a_400_problem_naming_that_header() {
    let cases = [
        ("grpc-timeout", "1"),
        ("grpc-timeout", "123456789m"),
        ("grpc-timeout", "1s"),
        ("grpc-timeout", "-1S"),
        ("x-envoy-expected-rq-timeout-ms", "250ms"),
        ("x-envoy-expected-rq-timeout-ms", "-5"),
    ];
    for (header, bad) in cases {
        // Next to a valid budget of ours: one malformed header is enough to refuse.
        let headers = [("X-Request-Timeout-Ms", "900"), (header, bad)];
        let (parts, body) = call_with(
            app(DeadlineLayer::new(policy(500, 300))),
            "/budget",
            &headers,
        )
        .await;
        assert_eq!(parts.status, StatusCode::BAD_REQUEST, "{header}: {bad:?}");
        let problem = json(&body);
        assert_eq!(problem["type"], "urn:problem:invalid-header");
        assert_eq!(problem["header"], header, "{bad:?}");
        assert!(
            problem["detail"].as_str().unwrap().starts_with(header),
            "{problem}"
        );
    }
}

#[tokio::test]
async fn the_smallest_of_the_budget_headers_is_the_handlers_budget() {
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[("grpc-timeout", "250m")], "250"),
        (&[("grpc-timeout", "1500u")], "2"),
        (&[("x-envoy-expected-rq-timeout-ms", "250")], "250"),
        (
            &[
                ("X-Request-Timeout-Ms", "400"),
                ("grpc-timeout", "1S"),
                ("x-envoy-expected-rq-timeout-ms", "250"),
            ],
            "250",
        ),
    ];
    for (headers, expected) in cases {
        let (parts, body) = call_with(
            app(DeadlineLayer::new(policy(500, 300))),
            "/budget",
            headers,
        )
        .await;
        assert_eq!(parts.status, StatusCode::OK, "{headers:?}");
        let text = String::from_utf8(body).unwrap();
        assert_eq!(text.split_once(' ').unwrap().0, expected, "{headers:?}");
    }
}

#[tokio::test]
async fn a_handler_slower_than_its_budget_gets_a_504_ingress_at_the_budget() {
    let started = Instant::now();
    let (parts, body) = call(
        app(DeadlineLayer::new(policy(2000, 1000))),
        "/slow",
        Some("300"),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(parts.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(took >= MS(300) && took < MS(400), "answered after {took:?}");
    let problem = json(&body);
    assert_eq!(problem["stage"], "ingress");
    assert_eq!(problem["budget_ms"], 300);
    assert!(problem["elapsed_ms"].as_u64().unwrap() >= 300);
}

#[tokio::test]
async fn an_already_expired_deadline_means_the_io_step_never_starts() {
    let io_started = Arc::new(AtomicBool::new(false));
    let flag = io_started.clone();
    let handler = move |deadline: Deadline| async move {
        // Work before the I/O step (blocking on purpose) uses up the whole 1 ms budget.
        std::thread::sleep(MS(5));
        deadline
            .run(Stage::Db, async { flag.store(true, Ordering::SeqCst) })
            .await
            .map_err(Problem::from)
    };
    let app = Router::new()
        .route("/io", get(handler))
        .route_layer(DeadlineLayer::new(policy(500, 300)));
    let (parts, body) = call(app, "/io", Some("0")).await;
    assert_eq!(parts.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(json(&body)["stage"], "db");
    assert!(!io_started.load(Ordering::SeqCst), "the I/O step ran");
}

#[tokio::test]
async fn responses_carry_server_timing_with_each_stage() {
    let handler = |deadline: Deadline| async move {
        deadline
            .run(Stage::named("catalog"), tokio::time::sleep(MS(20)))
            .await?;
        deadline.run(Stage::Db, async {}).await?;
        Ok::<_, Problem>("ok")
    };
    let app = Router::new()
        .route("/", get(handler))
        .route_layer(DeadlineLayer::new(policy(500, 300)));
    let (parts, _) = call(app, "/", None).await;
    let timing = parts.headers["server-timing"].to_str().unwrap();
    assert!(timing.starts_with("catalog;dur=2"), "{timing}");
    assert!(
        timing.contains(", db;dur=") && timing.contains(", total;dur="),
        "{timing}"
    );
}

/// Every response says where its time went (`Server-Timing`), a refusal before the
/// handler too (schemathesis found the ingress's 400s without it).
#[tokio::test]
async fn a_refusal_at_the_ingress_carries_server_timing_too() {
    let refusals: [&[(&str, &str)]; 3] = [
        &[("X-Request-Timeout-Ms", "-1")],
        &[("grpc-timeout", "1.5S")],
        &[
            ("X-Request-Timeout-Ms", "10"),
            ("X-Request-Timeout-Ms", "20"),
        ],
    ];
    for headers in refusals {
        let app = app(DeadlineLayer::new(policy(500, 300)));
        let (parts, _) = call_with(app, "/budget", headers).await;
        assert_eq!(parts.status, StatusCode::BAD_REQUEST, "{headers:?}");
        let timing = parts
            .headers
            .get("server-timing")
            .map(|v| v.to_str().unwrap());
        assert!(
            timing.is_some_and(|t| t.starts_with("total;dur=")),
            "{headers:?}: {timing:?}"
        );
    }
    let app = app(DeadlineLayer::new(policy(500, 300)).honour_mode_header(true));
    let (parts, _) = call_with(app, "/budget", &[("X-Deadline-Mode", "sideways")]).await;
    assert_eq!(parts.status, StatusCode::BAD_REQUEST);
    assert!(parts.headers.contains_key("server-timing"));
}

#[tokio::test]
async fn clamps_budgets_and_expiries_are_counted() {
    let metrics = Metrics::new("test");
    let layer = DeadlineLayer::new(policy(500, 300)).with_metrics(&metrics);
    call(app(layer.clone()), "/budget", Some("60000")).await;
    call(app(layer.clone()), "/budget", Some("100")).await;
    call(app(layer), "/slow", Some("50")).await;
    let text = metrics.render();
    let value = |name, labels| metric_value(&text, name, labels);
    assert_eq!(
        value("deadline_clamped_total", r#"service="test""#),
        Some(1.0)
    );
    assert_eq!(
        value("deadline_inbound_budget_seconds_count", r#"service="test""#),
        Some(3.0)
    );
    assert_eq!(
        value(
            "deadline_exceeded_total",
            r#"service="test",stage="ingress""#
        ),
        Some(1.0)
    );
}

/// Each hop's own promise (`deadline_overrun_seconds`), read on its `/metrics`: an answer in
/// time and a 504 at the deadline are 0 late; the one answer the ingress lets through
/// after the deadline, a COMMIT's outcome, is observed as late as it was.
#[tokio::test(start_paused = true)]
async fn how_late_past_the_deadline_each_answer_left_is_observed() {
    let metrics = Metrics::new("test");
    let layer = DeadlineLayer::new(policy(500, 300)).with_metrics(&metrics);
    let commit = |deadline: Deadline| async move {
        tokio::time::sleep_until(deadline.instant() - MS(5)).await;
        let _no_return = deadline.point_of_no_return();
        tokio::time::sleep(MS(100)).await;
        "committed"
    };
    let committing = Router::new()
        .route("/", get(commit))
        .route_layer(layer.clone());
    call(app(layer.clone()), "/budget", Some("100")).await;
    let (expired, _) = call(app(layer), "/slow", Some("50")).await;
    assert_eq!(expired.status, StatusCode::GATEWAY_TIMEOUT);
    let (late, _) = call(committing, "/", Some("100")).await;
    assert_eq!(late.status, StatusCode::OK);
    let text = metrics.render();
    let bucket = |le| {
        let labels = format!(r#"le="{le}",service="test""#);
        metric_value(&text, "deadline_overrun_seconds_bucket", &labels)
    };
    // Paused time: the two in time are exactly 0 late, the COMMIT's answer 95 ms.
    assert_eq!(bucket("0.001"), Some(2.0), "{text}");
    assert_eq!(bucket("0.075"), Some(2.0), "{text}");
    assert_eq!(bucket("0.1"), Some(3.0), "{text}");
}

/// A handler that sends its COMMIT 5 ms before the deadline and learns the outcome
/// `commit_takes` later.
fn committing(commit_takes: Option<Duration>) -> Router {
    let handler = move |deadline: Deadline| async move {
        tokio::time::sleep_until(deadline.instant() - MS(5)).await;
        let _no_return = deadline.point_of_no_return();
        match commit_takes {
            Some(took) => tokio::time::sleep(took).await,
            None => std::future::pending::<()>().await,
        }
        "committed"
    };
    Router::new()
        .route("/", get(handler))
        .route_layer(DeadlineLayer::new(policy(500, 300)))
}

#[tokio::test(start_paused = true)]
async fn a_commit_on_the_wire_at_the_deadline_is_answered_by_its_outcome() {
    let started = Instant::now();
    let (parts, body) = call(committing(Some(MS(100))), "/", Some("300")).await;
    assert_eq!(
        parts.status,
        StatusCode::OK,
        "not a 504: the commit succeeded"
    );
    assert_eq!(body, b"committed");
    assert_eq!(started.elapsed(), MS(395));
}

#[tokio::test(start_paused = true)]
async fn a_commit_whose_outcome_never_comes_is_a_500_that_promises_nothing() {
    let started = Instant::now();
    let (parts, body) = call(committing(None), "/", Some("300")).await;
    assert_eq!(parts.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(json(&body)["type"], "urn:problem:outcome-unknown");
    assert_eq!(
        started.elapsed(),
        MS(300) + deadline_propagation::NO_RETURN_GRACE,
        "bounded by the grace"
    );
}

#[tokio::test(start_paused = true)]
async fn after_the_point_of_no_return_ends_the_deadline_applies_again() {
    let handler = |deadline: Deadline| async move {
        drop(deadline.point_of_no_return());
        tokio::time::sleep(Duration::from_secs(2)).await;
        "finished"
    };
    let app = Router::new()
        .route("/", get(handler))
        .route_layer(DeadlineLayer::new(policy(500, 300)));
    let started = Instant::now();
    let (parts, _) = call(app, "/", Some("300")).await;
    assert_eq!(parts.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(started.elapsed(), MS(300));
}

/// Reports the mode the request runs in.
async fn report_mode(deadline: Deadline) -> &'static str {
    deadline.mode().as_str()
}

/// `X-Deadline-Mode: observe` makes a request run in observe where the layer honours
/// it, and only there; a misspelt marker is a 400 naming it.
#[tokio::test]
async fn an_observing_caller_is_observed_only_where_the_marker_is_honoured() {
    let mode_app = |layer: DeadlineLayer| {
        Router::new()
            .route("/mode", get(report_mode))
            .route_layer(layer)
    };
    let honouring = || DeadlineLayer::new(policy(500, 300)).honour_mode_header(true);
    let marked = [("X-Deadline-Mode", "observe")];
    let mode_of = |(parts, body): (http::response::Parts, Vec<u8>)| {
        assert_eq!(parts.status, StatusCode::OK);
        String::from_utf8(body).unwrap()
    };
    assert_eq!(
        mode_of(call_with(mode_app(honouring()), "/mode", &marked).await),
        "observe"
    );
    assert_eq!(
        mode_of(call_with(mode_app(honouring()), "/mode", &[]).await),
        "propagate"
    );
    let edge = DeadlineLayer::new(policy(500, 300));
    assert_eq!(
        mode_of(call_with(mode_app(edge), "/mode", &marked).await),
        "propagate"
    );

    let (parts, body) = call_with(
        mode_app(honouring()),
        "/mode",
        &[("X-Deadline-Mode", "off")],
    )
    .await;
    assert_eq!(parts.status, StatusCode::BAD_REQUEST);
    let problem = json(&body);
    assert_eq!(problem["header"], "X-Deadline-Mode", "{problem}");
}
