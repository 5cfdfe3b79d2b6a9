//! `x-request-id`: every answer of orders-service names its request, the caller's id
//! or a new UUID, in every mode and whoever answers (handler, body limit, ingress,
//! router).

mod common;

use common::spawn_app;
use reqwest::{Response, StatusCode};
use serde_json::json;

fn request_id(response: &Response) -> String {
    let id = response.headers().get("x-request-id");
    let id = id.unwrap_or_else(|| panic!("{} has no x-request-id", response.status()));
    id.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn every_answer_carries_the_request_id_the_callers_or_a_new_one_in_every_mode() {
    let app = spawn_app().await;
    for mode in ["propagate", "legacy"] {
        app.switch_mode(mode).await;

        let first = app.order("SKU-00001", 1, None).await;
        let second = app.get("/healthz").await;
        assert_eq!(first.status(), StatusCode::CREATED, "{mode}");
        let (first, second) = (request_id(&first), request_id(&second));
        for made in [&first, &second] {
            let parts: Vec<usize> = made.split('-').map(str::len).collect();
            assert_eq!(parts, [8, 4, 4, 4, 12], "{mode}: a UUID: {made}");
        }
        assert_ne!(first, second, "{mode}");

        let oversize = "x".repeat(orders_service::routes::MAX_BODY_BYTES + 1);
        let cases = [
            (
                json!({"sku": "SKU-00001", "quantity": 1}).to_string(),
                StatusCode::CREATED,
            ),
            ("{not json".to_owned(), StatusCode::BAD_REQUEST),
            (oversize, StatusCode::PAYLOAD_TOO_LARGE),
        ];
        for (body, status) in cases {
            let response = app
                .client
                .post(format!("{}/api/orders", app.base))
                .header("content-type", "application/json")
                .header("x-request-id", "checkout-7")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), status, "{mode}");
            assert_eq!(request_id(&response), "checkout-7", "{mode} {status}");
        }
        let unrouted = app
            .client
            .get(format!("{}/no/such/path", app.base))
            .header("x-request-id", "checkout-8")
            .send()
            .await
            .unwrap();
        assert_eq!(unrouted.status(), StatusCode::NOT_FOUND, "{mode}");
        assert_eq!(request_id(&unrouted), "checkout-8", "{mode}");
    }
}

/// The ingress refuses a malformed budget header before any handler runs (propagate
/// only: legacy reads no budget); the refusal names the request all the same.
#[tokio::test]
async fn a_refusal_at_the_ingress_carries_the_request_id() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(format!("{}/api/orders/1", app.base))
        .header("X-Request-Timeout-Ms", "soon")
        .header("x-request-id", "checkout-9")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(request_id(&response), "checkout-9");
}
