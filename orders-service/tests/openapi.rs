//! The OpenAPI document: served at `GET /openapi.json`, and the committed copy is it.

mod common;

use common::spawn_app;
use reqwest::StatusCode;

#[tokio::test]
async fn the_served_document_is_the_committed_one() {
    let app = spawn_app().await;
    let document =
        test_support::served_openapi(&app.client, &app.base, "docs/openapi/orders-service.json")
            .await;
    // The public API, and nothing of the admin port, MCP or metrics.
    let paths = test_support::openapi_paths(&document);
    assert_eq!(
        paths,
        [
            "/api/assistant/chat",
            "/api/orders",
            "/api/orders/{id}",
            "/api/orders/{id}/shipments",
            "/api/shipments/{job}",
            "/health/dependencies",
            "/healthz",
            "/readyz"
        ]
    );
}

/// The document's grammar of a budget header and the service's parser agree, at the
/// edges where they could part: the largest number the service takes, the first it
/// refuses, leading zeros. A client generated from the document must never send what
/// the service refuses (schemathesis found `^[0-9]+$` letting 20-digit numbers through).
#[tokio::test]
async fn the_budget_pattern_accepts_exactly_what_the_service_accepts() {
    let app = spawn_app().await;
    let document =
        test_support::served_openapi(&app.client, &app.base, "docs/openapi/orders-service.json")
            .await;
    let parameters = document["paths"]["/api/orders/{id}"]["get"]["parameters"]
        .as_array()
        .unwrap();
    for header in ["X-Request-Timeout-Ms", "x-envoy-expected-rq-timeout-ms"] {
        let schema = &parameters
            .iter()
            .find(|p| p["name"] == header)
            .unwrap_or_else(|| panic!("{header} is not in the document"))["schema"];
        let pattern =
            regex_automata::meta::Regex::new(schema["pattern"].as_str().unwrap()).unwrap();
        let max_length = schema["maxLength"].as_u64().unwrap() as usize;
        let padded = format!("{}1", "0".repeat(max_length - 1));
        for value in [
            "0",
            "250",
            "000250",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999",
            "1e3",
            padded.as_str(),
        ] {
            let documented = pattern.is_match(value) && value.len() <= max_length;
            let response = app
                .client
                .get(format!("{}/api/orders/1", app.base))
                .header(header, value)
                .send()
                .await
                .unwrap();
            let accepted = response.status() != StatusCode::BAD_REQUEST;
            assert_eq!(
                documented,
                accepted,
                "{header}: {value}: the document says {}, the service answered {}",
                if documented { "valid" } else { "invalid" },
                response.status()
            );
        }
    }
}
