//! The bodies and headers of problem answers.

use super::*;
use axum::response::{IntoResponse, Response};
use http::header;
use http_body_util::BodyExt;

async fn body_of(problem: Problem) -> (Response, serde_json::Value) {
    let response = problem.into_response();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        Response::from_parts(parts, axum::body::Body::empty()),
        serde_json::from_slice(&bytes).unwrap(),
    )
}

#[tokio::test]
async fn a_deadline_problem_carries_stage_budget_and_elapsed() {
    let (response, body) = body_of(Problem::deadline(DeadlineExceeded {
        stage: Stage::named("catalog"),
        budget: Duration::from_millis(300),
        elapsed: Duration::from_millis(301),
    }))
    .await;
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
    assert_eq!(body["stage"], "catalog");
    assert_eq!(body["budget_ms"], 300);
    assert_eq!(body["elapsed_ms"], 301);
    assert_eq!(body["status"], 504);
}

#[tokio::test]
async fn an_overload_problem_carries_retry_after() {
    let (response, body) = body_of(Problem::overloaded(
        crate::Downstream::new("catalog").unwrap().pool(),
        Duration::from_millis(40),
        "queue full",
    ))
    .await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    assert_eq!(body["stage"], "catalog_pool");
}

#[test]
fn retry_after_rounds_a_fraction_of_a_second_up() {
    for (wait_ms, header) in [(0, "1"), (40, "1"), (1000, "1"), (1001, "2"), (2500, "3")] {
        let response = Problem::overloaded(
            Stage::named("catalog"),
            Duration::from_millis(wait_ms),
            "busy",
        )
        .into_response();
        assert_eq!(
            response.headers()[header::RETRY_AFTER],
            header,
            "{wait_ms} ms"
        );
    }
}

#[tokio::test]
async fn an_internal_problem_hides_its_cause_from_the_client() {
    let (response, body) = body_of(Problem::internal("password=hunter2")).await;
    assert!(!body.to_string().contains("hunter2"));
    let report = response.extensions().get::<ProblemReport>().unwrap();
    assert_eq!(report.cause.as_deref(), Some("password=hunter2"));
}
