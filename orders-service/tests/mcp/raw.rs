//! A bare streamable-HTTP MCP client (plain reqwest), for a client that leaves without
//! a word: initialize, `notifications/initialized`, a `tools/call` whose response is
//! then dropped unfinished, and optionally the session `DELETE`.
//!
//! rmcp's own client cannot leave like that (rmcp 3.11, `service/client.rs` and
//! `transport/streamable_http_client.rs`): dropping a `call_tool` future sends
//! `notifications/cancelled` (its `AbandonedRequestGuard`), and closing or dropping the
//! client ends the in-flight POSTs and then always sends `DELETE /mcp` for the session.

use std::time::Duration;

use reqwest::{Client, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const PROTOCOL: &str = "2025-06-18";

pub(crate) struct RawSession {
    client: Client,
    url: String,
    session: String,
}

impl RawSession {
    /// The initialize handshake; panics unless the server answers it with a session.
    pub(crate) async fn open(base: &str) -> Self {
        let client = Client::new();
        let url = format!("{base}/mcp");
        let initialize = json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": { "name": "raw-test-client", "version": "0" },
            },
        });
        let response = post(&client, &url, &initialize)
            .send()
            .await
            .expect("initialize sent");
        assert_eq!(response.status(), StatusCode::OK);
        let session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = tokio::time::timeout(Duration::from_secs(5), response.text())
            .await
            .expect("the initialize answer ends")
            .unwrap();
        assert!(body.contains(r#""result""#), "initialize answered {body}");
        let raw = Self {
            client,
            url,
            session,
        };
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let response = raw.post(&initialized).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        raw
    }

    /// `tools/call` in a task of its own that reads the answer to its end; aborting the
    /// task drops the request or its response, which closes the connection.
    pub(crate) fn call(&self, tool: &str, sku: &str) -> JoinHandle<String> {
        let request = self.post(&json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": tool, "arguments": { "sku": sku } },
        }));
        tokio::spawn(async move { request.send().await.unwrap().text().await.unwrap() })
    }

    /// `DELETE /mcp`: the session ends.
    pub(crate) async fn delete(&self) -> Response {
        self.client
            .delete(&self.url)
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", PROTOCOL)
            .send()
            .await
            .expect("DELETE sent")
    }

    fn post(&self, message: &Value) -> RequestBuilder {
        post(&self.client, &self.url, message)
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", PROTOCOL)
    }
}

fn post(client: &Client, url: &str, message: &Value) -> RequestBuilder {
    client
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(message)
}
