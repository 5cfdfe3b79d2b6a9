//! The MCP server at `/mcp` (streamable HTTP): the same tools, the same budgets.
//!
//! Each `tools/call` runs under the per-tool cap, and under `X-Request-Timeout-Ms` when
//! the client sent one (the ingress layer put the request's [`Deadline`] into the HTTP
//! request, which rmcp hands to the handler). A tool out of budget answers an error
//! result (`isError: true`) instead of hanging.
//!
//! Cancellation: rmcp cancels the call's `CancellationToken` when the client sends
//! `notifications/cancelled`. Cancelling the transport alone would not stop anything:
//! the token is raced against the tool, and dropping the tool drops its catalog request
//! (the connection closes, the catalog stops) and cancels its SQL statement on the
//! server (`Db::run_cancellable`).
//!
//! A client that simply goes away sends no notification, and rmcp lets the handler run
//! on. So [`watch_disconnect`] gives each HTTP request a [`ClientGone`] token, cancelled
//! when the response carrying the call's result is dropped unfinished (hyper drops it
//! when the connection closes); the handler races that token too.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use pin_project_lite::pin_project;

use deadline_propagation::tools::{ToolBudget, ToolOutcome as Outcome, ToolPolicy};
use deadline_propagation::{Deadline, Problem};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool as McpTool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::tools::Tool;
use crate::AppState;
use crate::budget::Budget;
use service_kit::answers::Answers as _;

/// The MCP handler; one is made per session.
#[derive(Clone, Debug)]
pub struct McpServer {
    state: AppState,
}

/// The tower service to mount at `/mcp`. `shutdown` ends open sessions so graceful
/// shutdown is not held up by idle event streams.
///
/// `allowed_hosts` and `allowed_origins` guard against DNS rebinding and cross-site
/// requests: a web page on another site can make the user's browser send requests to
/// a server on the user's machine, and the MCP transport requires servers to check
/// `Origin` for that reason. A request with a `Host` or `Origin` not allowed is 403; one
/// without `Origin` does not come from a browser page and is served. rmcp checks
/// `Origin` only when asked to, so it is asked to here, also when the list is empty
/// (then every `Origin` is refused).
pub fn service(
    state: AppState,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    shutdown: CancellationToken,
) -> StreamableHttpService<McpServer, LocalSessionManager> {
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_allowed_origins(allowed_origins)
        .enforce_origin_validation();
    config.cancellation_token = shutdown;
    let server = McpServer { state };
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "Product tools. Each call is bounded by a time budget and answers an error when it runs out.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = Tool::ALL
            .iter()
            .map(|tool| McpTool::new(tool.name(), tool.description(), tool.input_schema()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = Tool::named(&request.name).ok_or_else(|| {
            ErrorData::invalid_params(format!("unknown tool {:?}", request.name), None)
        })?;
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let policy = self.state.assistant.policy;
        // One call, capped like one tool of a chat turn.
        let mut one_call = ToolPolicy::default();
        one_call.turn = policy.per_tool;
        one_call.per_tool = policy.per_tool;
        one_call.max_calls = 1;
        let cancel = cancelled_or_gone(&context);
        let call = match request_deadline(&context, policy) {
            Some(deadline) => {
                let budget =
                    ToolBudget::for_turn(&deadline, one_call).with_metrics(&self.state.metrics);
                let run = |deadline| tool.run(&self.state, Budget::Deadline(deadline), &arguments);
                budget.call(tool.name(), &cancel, run).await
            }
            None => super::chat::run_unbudgeted(&self.state, tool, &arguments).await,
        };
        let text = match (&call.result, call.outcome) {
            (Some(result), _) => result.to_string(),
            (None, outcome) => format!(
                "{} {}: {}",
                tool.name(),
                outcome.as_str(),
                call.error.as_deref().unwrap_or("failed")
            ),
        };
        let content = vec![ContentBlock::text(text)];
        Ok(match call.outcome {
            Outcome::Ok => CallToolResult::success(content),
            _ => CallToolResult::error(content),
        }
        .into())
    }
}

/// The deadline of the HTTP request carrying this call, when the ingress set one;
/// otherwise the per-tool cap from now; `None` in legacy, which has no budget.
fn request_deadline(context: &RequestContext<RoleServer>, policy: ToolPolicy) -> Option<Deadline> {
    let parts = context.extensions.get::<http::request::Parts>();
    if let Some(deadline) = parts.and_then(|parts| parts.extensions.get::<Deadline>()) {
        return Some(deadline.clone());
    }
    let legacy = parts.and_then(|parts| parts.extensions.get::<Budget>());
    match legacy {
        Some(Budget::Unbounded) => None,
        _ => Some(Deadline::after(policy.per_tool)),
    }
}

/// Middleware for `/mcp`: rmcp answers its own refusals of a `Host` or `Origin` not
/// allowed as a 403 in plain text; the contract's errors are problem+json
/// (docs/design.md §3.6), so the refusal is passed on as one, with rmcp's reason.
pub async fn refusals_as_problems(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.status() != http::StatusCode::FORBIDDEN {
        return response;
    }
    // rmcp's reason is one short line; anything longer is cut, not waited for.
    let reason = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap_or_default();
    let reason = String::from_utf8_lossy(&reason);
    Problem::forbidden(format!("/mcp refused the request: {}", reason.trim())).into_response()
}

/// Cancelled when the client that sent this HTTP request went away before its answer
/// was sent.
#[derive(Clone, Debug)]
pub struct ClientGone(CancellationToken);

/// Middleware for `/mcp`: attaches a [`ClientGone`] token to the request and keeps its
/// drop guard alive for as long as the response is being sent.
pub async fn watch_disconnect(mut request: Request, next: Next) -> Response {
    let gone = CancellationToken::new();
    request.extensions_mut().insert(ClientGone(gone.clone()));
    // Dropped with this future if the client leaves before the response starts...
    let guard = gone.drop_guard();
    let response = next.run(request).await;
    // ...or with the body if it leaves while the result is still to come.
    response.map(|body| {
        Body::new(GuardedBody {
            inner: body,
            _guard: guard,
        })
    })
}

pin_project! {
    /// A response body that cancels its [`ClientGone`] token when dropped.
    struct GuardedBody {
        #[pin]
        inner: Body,
        _guard: DropGuard,
    }
}

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// One token for "stop this tool": the MCP cancel, or the client gone.
fn cancelled_or_gone(context: &RequestContext<RoleServer>) -> CancellationToken {
    let either = context.ct.child_token();
    let gone = context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<ClientGone>())
        .map(|ClientGone(token)| token.clone());
    if let Some(gone) = gone {
        let either = either.clone();
        // Ends when the response is done (the guard fires then too) or the call is.
        tokio::spawn(async move {
            tokio::select! {
                () = gone.cancelled() => either.cancel(),
                () = either.cancelled() => {}
            }
        });
    }
    either
}
