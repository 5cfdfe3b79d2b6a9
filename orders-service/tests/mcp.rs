//! The MCP server (`/mcp`) driven by rmcp's own client over real HTTP: tools listed and
//! called, a tool out of budget, the request's `X-Request-Timeout-Ms` capping the tool,
//! and a cancellation that stops the tool's catalog call and its SQL statement on the
//! server without costing the pooled connection. A client that just goes away (no
//! `notifications/cancelled`) is played by a bare streamable-HTTP client ([`raw`]).

mod common;
#[path = "mcp/raw.rs"]
mod raw;

use std::collections::HashMap;

use common::{MS, TestApp, spawn_app, spawn_app_with};
use http::{HeaderName, HeaderValue};
use raw::RawSession;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest};
use rmcp::service::{PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use sqlx::Connection;
use test_support::{metric_value, wait_until};
use tokio::time::Instant;

/// How long a cancelled tool may take to end and still prove that the cancel ended it:
/// what is left of the tool's budget (`ASSISTANT_TOOL_BUDGET_MS`) since the call began,
/// less 100 ms, so the budget itself cannot have done it. Everything else the machine is
/// doing may use the rest.
fn before_the_tool_budget(started: Instant) -> std::time::Duration {
    let settings = orders_service::Config::for_tests("http://unused", "postgres://unused");
    let budget = MS(settings.assistant_tool_budget_ms);
    budget
        .saturating_sub(started.elapsed())
        .saturating_sub(MS(100))
}

type Client = RunningService<RoleClient, ()>;

async fn connect(app: &TestApp) -> Client {
    connect_with(app, HashMap::new()).await
}

/// A client that sends `headers` on every HTTP request of the session.
async fn connect_with(app: &TestApp, headers: HashMap<HeaderName, HeaderValue>) -> Client {
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.base))
        .custom_headers(headers);
    let transport = StreamableHttpClientTransport::from_config(config);
    ().serve(transport).await.expect("an MCP session")
}

fn call(tool: &str, sku: &str) -> CallToolRequestParams {
    let arguments = json!({ "sku": sku }).as_object().cloned().unwrap();
    CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments)
}

/// The first text block of a tool result, as JSON when it is JSON.
fn text(result: &CallToolResult) -> Value {
    let value = serde_json::to_value(result).unwrap();
    let text = value["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// Catalog requests being served right now, from the catalog's own `/metrics`.
/// A lookup that must end as an error result (not a hang, not a protocol error), and
/// how long it took.
async fn lookup_that_fails(client: &Client) -> std::time::Duration {
    let started = Instant::now();
    let call = client.call_tool(call("catalog_lookup", "SKU-00001"));
    let result = call.await.unwrap();
    assert_eq!(result.is_error, Some(true), "{result:?}");
    started.elapsed()
}

async fn catalog_in_flight(app: &TestApp) -> f64 {
    let text = app.scrape(&app.catalog_url).await;
    metric_value(
        &text,
        "http_server_requests_in_flight",
        r#"uri="/catalog/{sku}""#,
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn the_tools_are_listed_and_answer() {
    let app = spawn_app().await;
    let client = connect(&app).await;
    let mut names: Vec<_> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["catalog_lookup", "inventory_check"]);

    let lookup = client
        .call_tool(call("catalog_lookup", "SKU-00042"))
        .await
        .unwrap();
    assert_ne!(lookup.is_error, Some(true), "{lookup:?}");
    assert_eq!(text(&lookup)["sku"], "SKU-00042");
    assert!(text(&lookup)["price_cents"].as_u64().is_some());
    let stock = client
        .call_tool(call("inventory_check", "SKU-00042"))
        .await
        .unwrap();
    assert!(text(&stock)["available"].as_i64().is_some(), "{stock:?}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_tool_out_of_budget_is_an_error_result_at_its_cap() {
    let app = spawn_app().await;
    app.slow_catalog(2000);
    let client = connect(&app).await;
    let took = lookup_that_fails(&client).await;
    assert!(took < MS(800 + 150), "the 800 ms tool cap held: {took:?}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn the_request_header_budget_caps_the_tool_budget() {
    let app = spawn_app().await;
    app.slow_catalog(2000);
    let budget = (
        HeaderName::from_static("x-request-timeout-ms"),
        HeaderValue::from_static("300"),
    );
    let client = connect_with(&app, HashMap::from([budget])).await;
    let took = lookup_that_fails(&client).await;
    // Well under the 800 ms tool cap: the 300 ms of the header bound it.
    assert!(
        took < MS(300 + 150),
        "the 300 ms header budget held: {took:?}"
    );
    let budgets = app.catalog_budgets.lock().unwrap().clone();
    assert!(
        matches!(budgets[..], [Some(ms)] if ms <= 300),
        "the catalog was given what was left of 300 ms: {budgets:?}"
    );
    println!("header budget 300 ms: error result after {took:?}, catalog budgets {budgets:?}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_lookup_closes_its_catalog_call_at_once() {
    let app = spawn_app().await;
    app.slow_catalog(2000);
    let client = connect(&app).await;
    let request =
        ClientRequest::CallToolRequest(CallToolRequest::new(call("catalog_lookup", "SKU-00042")));
    let started = Instant::now();
    let handle = client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    wait_until("the catalog serves the tool's call", MS(2000), || async {
        catalog_in_flight(&app).await == 1.0
    })
    .await;
    handle
        .cancel(Some("test: cancel mid-flight".into()))
        .await
        .unwrap();
    let bound = before_the_tool_budget(started);
    wait_until("the catalog call is gone", bound, || async {
        catalog_in_flight(&app).await == 0.0
    })
    .await;
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_stock_check_stops_its_statement_and_keeps_its_connection() {
    let app = spawn_app().await;
    let client = connect(&app).await;
    // One call first, so the pool holds the session the next call will use.
    client
        .call_tool(call("inventory_check", "SKU-00001"))
        .await
        .unwrap();
    let before = app.service_backends().await;

    let mut locker = app.side_connection().await;
    let mut lock = locker.begin().await.unwrap();
    sqlx::raw_sql("LOCK TABLE inventory IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let request =
        ClientRequest::CallToolRequest(CallToolRequest::new(call("inventory_check", "SKU-00001")));
    let started = Instant::now();
    let handle = client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    wait_until("the tool's SELECT waits on the lock", MS(2000), || async {
        app.service_lock_waiters().await == 1
    })
    .await;
    handle
        .cancel(Some("test: cancel mid-flight".into()))
        .await
        .unwrap();
    // Before the tool's budget would have ended it on the server.
    let bound = before_the_tool_budget(started);
    wait_until("the SELECT is gone from the server", bound, || async {
        app.service_lock_waiters().await == 0
    })
    .await;
    lock.rollback().await.unwrap();

    let after = client
        .call_tool(call("inventory_check", "SKU-00001"))
        .await
        .unwrap();
    assert!(text(&after)["available"].as_i64().is_some(), "{after:?}");
    assert!(
        app.service_backends().await.is_superset(&before),
        "the cancel cost no pooled session"
    );
    client.cancel().await.unwrap();
}

/// A client goes away mid-call without `notifications/cancelled`: its connection closes
/// under the unfinished answer (and the session is deleted after, when `delete`). The
/// server's `ClientGone` token ends the tool, well before its 800 ms budget would.
async fn leave_mid_call(delete: bool) {
    let app = spawn_app().await;
    app.slow_catalog(2000);
    let session = RawSession::open(&app.base).await;
    let started = Instant::now();
    let call = session.call("catalog_lookup", "SKU-00042");
    wait_until("the catalog serves the tool's call", MS(2000), || async {
        catalog_in_flight(&app).await == 1.0
    })
    .await;
    assert!(!call.is_finished(), "no answer yet: the catalog is slow");
    let left = Instant::now();
    call.abort();
    if delete {
        assert!(session.delete().await.status().is_success());
    }
    let bound = before_the_tool_budget(started);
    wait_until("the catalog call is gone", bound, || async {
        catalog_in_flight(&app).await == 0.0
    })
    .await;
    println!(
        "left mid-call (DELETE sent: {delete}): catalog call released {:?} after",
        left.elapsed()
    );
}

#[tokio::test]
async fn a_client_that_drops_its_connection_mid_call_releases_the_catalog_call() {
    leave_mid_call(false).await;
}

#[tokio::test]
async fn a_client_that_closes_its_session_mid_call_releases_the_catalog_call() {
    leave_mid_call(true).await;
}

/// An `initialize` sent with `headers`: the status `/mcp` answers it with. A refusal
/// must be a problem naming what was refused.
async fn initialize_with(app: &TestApp, headers: &[(&str, &str)]) -> reqwest::StatusCode {
    let mut request = app
        .client
        .post(format!("{}/mcp", app.base))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": { "name": "origin-test", "version": "0" },
            },
        }));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("initialize sent");
    let status = response.status();
    if status == reqwest::StatusCode::FORBIDDEN {
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: Value = response.json().await.expect("a problem");
        assert_eq!(problem["type"], "urn:problem:forbidden", "{problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("Origin") || detail.contains("Host"),
            "{problem}"
        );
    }
    status
}

/// A web page on another site must not reach the MCP server through the user's
/// browser (the transport's DNS-rebinding rule): a request whose `Origin` is not
/// allowed is 403, one from an allowed origin or with no `Origin` at all (not a
/// browser) is served. A foreign `Host` is refused too.
#[tokio::test]
async fn mcp_refuses_foreign_origins_and_hosts() {
    let app = spawn_app().await;
    let ok = reqwest::StatusCode::OK;
    let forbidden = reqwest::StatusCode::FORBIDDEN;
    assert_eq!(initialize_with(&app, &[]).await, ok, "no Origin");
    for origin in [
        "http://localhost:6274",
        "http://127.0.0.1:3000",
        "http://[::1]:8080",
    ] {
        assert_eq!(
            initialize_with(&app, &[("origin", origin)]).await,
            ok,
            "{origin}"
        );
    }
    for origin in [
        "http://evil.example.com",
        "https://localhost.evil.example.com:443",
        "null",
        "not an origin",
    ] {
        let status = initialize_with(&app, &[("origin", origin)]).await;
        assert_eq!(status, forbidden, "{origin}");
    }
    let host = initialize_with(&app, &[("host", "evil.example.com")]).await;
    assert_eq!(host, forbidden, "a foreign Host");
}

#[tokio::test]
async fn mcp_serves_the_origins_it_is_configured_for() {
    let app = spawn_app_with(|c| {
        c.mcp_allowed_origins = vec!["https://app.example.com:443".into()];
    })
    .await;
    let allowed = initialize_with(&app, &[("origin", "https://app.example.com")]).await;
    assert_eq!(allowed, reqwest::StatusCode::OK);
    for origin in ["http://app.example.com", "http://localhost:6274"] {
        let status = initialize_with(&app, &[("origin", origin)]).await;
        assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{origin}");
    }
}
