//! The OpenAPI document: served at `GET /openapi.json`, and the committed copy is it.

mod common;

use common::spawn_app;
use reqwest::StatusCode;

#[tokio::test]
async fn the_served_document_is_the_committed_one() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(format!("{}/openapi.json", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let served = response.text().await.unwrap();
    let document: serde_json::Value = serde_json::from_str(&served).unwrap();
    assert_eq!(document["openapi"], "3.1.0");
    // The public API, and nothing of the admin port, MCP or metrics.
    let paths: Vec<&str> = document["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        paths,
        [
            "/api/assistant/chat",
            "/api/orders",
            "/api/orders/{id}",
            "/healthz",
            "/readyz"
        ]
    );
    test_support::same_as_committed("docs/openapi/orders-service.json", &served);
}
