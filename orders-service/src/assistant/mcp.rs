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

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool as McpTool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use shared::Deadline;
use shared::tools::{Outcome, ToolBudget, ToolPolicy};
use tokio_util::sync::CancellationToken;

use super::tools::Tool;
use crate::AppState;

/// The MCP handler; one is made per session.
#[derive(Clone, Debug)]
pub struct McpServer {
    state: AppState,
}

/// The tower service to mount at `/mcp`. `shutdown` ends open sessions so graceful
/// shutdown is not held up by idle event streams; `allowed_hosts` guards against DNS
/// rebinding (rmcp allows only localhost by default; compose adds its service name).
pub fn service(
    state: AppState,
    allowed_hosts: Vec<String>,
    shutdown: CancellationToken,
) -> StreamableHttpService<McpServer, LocalSessionManager> {
    let mut config = StreamableHttpServerConfig::default().with_allowed_hosts(allowed_hosts);
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
        let one_call = ToolPolicy {
            turn: policy.per_tool,
            per_tool: policy.per_tool,
            max_calls: 1,
        };
        let budget = ToolBudget::for_turn(
            &request_deadline(&context, policy),
            one_call,
            Some(self.state.metrics.tools().clone()),
        );
        let call = budget
            .call(tool.name(), &context.ct, |deadline| {
                tool.run(&self.state, deadline, &arguments)
            })
            .await;
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
/// otherwise the per-tool cap from now.
fn request_deadline(context: &RequestContext<RoleServer>, policy: ToolPolicy) -> Deadline {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Deadline>())
        .cloned()
        .unwrap_or_else(|| Deadline::after(policy.per_tool))
}
