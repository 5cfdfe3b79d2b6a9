//! `POST /api/assistant/chat`: plan, then run the tool calls under the turn's budget.

use axum::Json;
use axum::extract::State;
use deadline_propagation::tools::{ToolBudget, ToolCall, ToolOutcome as Outcome};
use deadline_propagation::{Deadline, Problem};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use service_kit::json::JsonBody;
use service_kit::openapi::ProblemDetails;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::planner::PlannedCall;
use super::tools::Tool;
use crate::AppState;
use crate::budget::Budget;
use crate::legacy::LEGACY_TIMEOUT;
use service_kit::answers::Answers as _;

/// Messages longer than this are refused (422): planning is cheap, but not free.
const MAX_MESSAGE_CHARS: usize = 4000;

/// The turn ends this much before the request's deadline, so the partial answer is
/// still sent instead of the ingress's 504.
const ANSWER_RESERVE: std::time::Duration = std::time::Duration::from_millis(10);

/// The request body.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"message": "what does SKU-00042 cost?"}))]
pub struct ChatRequest {
    /// What the user asks; not blank, at most 4000 characters.
    // "Not blank" in the pattern: a character that is not whitespace as the handler's
    // `trim` counts it (Unicode's White_Space). JSON Schema's `\S` is ECMAScript's, for
    // which U+FEFF is whitespace and U+0085 is not.
    #[schema(required, value_type = String, min_length = 1, max_length = 4000,
             pattern = "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]")]
    message: Option<String>,
}

/// The answer: text plus the record of every tool call.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatAnswer {
    /// The answer, from whatever the tools returned.
    answer: String,
    /// `rules` or `llm`.
    #[schema(value_type = String)]
    planner: &'static str,
    /// The turn's budget: `min(ASSISTANT_TURN_BUDGET_MS, the request's remaining time)`.
    turn_budget_ms: u64,
    elapsed_ms: u64,
    /// True when some call did not return a result.
    partial: bool,
    /// Every tool call, in order.
    #[schema(value_type = Vec<ToolCallDoc>)]
    tool_calls: Vec<ToolCallRecord>,
}

/// One tool call as answered: [`ToolCallRecord`], whose [`ToolCall`] comes from the
/// crate, which has no OpenAPI of its own.
#[derive(ToSchema)]
#[schema(as = ToolCall)]
#[allow(
    dead_code,
    reason = "never built: it describes the JSON of a ToolCallRecord"
)]
struct ToolCallDoc {
    /// The tool's arguments, as planned.
    arguments: Value,
    /// `catalog_lookup` or `inventory_check`.
    tool: String,
    /// How it ended.
    outcome: OutcomeDoc,
    /// How long it ran.
    elapsed_ms: u64,
    /// Its result, when `outcome` is `ok`.
    #[schema(nullable = false)]
    result: Option<Value>,
    /// What went wrong, otherwise.
    #[schema(nullable = false)]
    error: Option<String>,
}

/// [`Outcome`]'s wire names.
#[derive(ToSchema)]
#[schema(as = ToolOutcome)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code, reason = "never built: it describes the JSON")]
enum OutcomeDoc {
    Ok,
    Error,
    Timeout,
    Refused,
    Cancelled,
}

/// One call: what was asked and how it ended.
#[derive(Debug, Serialize)]
struct ToolCallRecord {
    arguments: Value,
    #[serde(flatten)]
    call: ToolCall<Value>,
}

/// Plans and runs the tool calls one after another, as an agent loop does.
#[utoipa::path(
    post,
    path = "/api/assistant/chat",
    tag = "assistant",
    summary = "An assistant turn under tool budgets",
    description = "The turn gets `min(ASSISTANT_TURN_BUDGET_MS, the request's remaining time)`, \
                   each tool call what is left of it, up to a number of calls \
                   (docs/design.md §6). A tool that runs out of time is reported in the \
                   answer, which is then `partial`.",
    request_body(content = ChatRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer and every tool call", body = ChatAnswer),
        (status = 422, description = "No message, a blank one, or one over 4000 characters", body = ProblemDetails),
        (status = 502, description = "The LLM planner failed", body = ProblemDetails),
    )
)]
pub async fn chat(
    State(state): State<AppState>,
    budget: Budget,
    JsonBody(request): JsonBody<ChatRequest>,
) -> Result<Json<ChatAnswer>, Problem> {
    let message = request
        .message
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| Problem::unprocessable("message is required"))?;
    if message.chars().count() > MAX_MESSAGE_CHARS {
        return Err(Problem::unprocessable(format!(
            "message must be at most {MAX_MESSAGE_CHARS} characters"
        )));
    }
    let Budget::Deadline(deadline) = budget else {
        return unbudgeted(&state, &message).await;
    };
    let answerable = deadline.child(deadline.remaining().saturating_sub(ANSWER_RESERVE));
    let budget =
        ToolBudget::for_turn(&answerable, state.assistant.policy).with_metrics(&state.metrics);
    let plan = state
        .assistant
        .planner
        .plan(&message, budget.turn())
        .await?;

    // A client that goes away drops this whole future, and with it the running tool.
    let never = CancellationToken::new();
    let mut records = Vec::with_capacity(plan.len());
    for PlannedCall { tool, arguments } in plan {
        let call = budget
            .call(tool.name(), &never, |tool_deadline| {
                tool.run(&state, Budget::Deadline(tool_deadline), &arguments)
            })
            .await;
        records.push(ToolCallRecord { arguments, call });
    }
    Ok(Json(ChatAnswer {
        answer: compose(&records),
        planner: state.assistant.planner.name(),
        turn_budget_ms: millis(budget.turn().budget()),
        elapsed_ms: millis(deadline.elapsed()),
        partial: records.iter().any(|r| r.call.outcome != Outcome::Ok),
        tool_calls: records,
    }))
}

/// The turn as legacy runs it: the same tools one after another, with no budget.
async fn unbudgeted(state: &AppState, message: &str) -> Result<Json<ChatAnswer>, Problem> {
    let started = Instant::now();
    let turn = Deadline::after(LEGACY_TIMEOUT);
    let plan = state.assistant.planner.plan(message, &turn).await?;
    let mut records = Vec::with_capacity(plan.len());
    for PlannedCall { tool, arguments } in plan {
        let call = run_unbudgeted(state, tool, &arguments).await;
        records.push(ToolCallRecord { arguments, call });
    }
    Ok(Json(ChatAnswer {
        answer: compose(&records),
        planner: state.assistant.planner.name(),
        turn_budget_ms: millis(LEGACY_TIMEOUT),
        elapsed_ms: millis(started.elapsed()),
        partial: records.iter().any(|r| r.call.outcome != Outcome::Ok),
        tool_calls: records,
    }))
}

/// One tool call without a budget (legacy), recorded as a budgeted one is.
pub(super) async fn run_unbudgeted(
    state: &AppState,
    tool: Tool,
    arguments: &Value,
) -> ToolCall<Value> {
    let started = Instant::now();
    let ran = tool.run(state, Budget::Unbounded, arguments).await;
    let (outcome, result, error) = match ran {
        Ok(value) => (Outcome::Ok, Some(value), None),
        Err(problem) => (Outcome::Error, None, Some(problem.detail().to_owned())),
    };
    ToolCall {
        tool: tool.name().to_owned(),
        outcome,
        elapsed_ms: millis(started.elapsed()),
        result,
        error,
    }
}

/// A plain-text answer built from whatever the tools returned.
fn compose(records: &[ToolCallRecord]) -> String {
    if records.is_empty() {
        return "I can look up prices and stock: mention a SKU such as SKU-00042.".to_owned();
    }
    let lines: Vec<String> = records
        .iter()
        .map(|r| {
            let sku = r.arguments["sku"].as_str().unwrap_or("?");
            match (&r.call.result, r.call.outcome) {
                (Some(v), _) if v.get("price_cents").is_some() => format!(
                    "{sku} ({}) costs {:.2}.",
                    v["name"].as_str().unwrap_or("?"),
                    v["price_cents"].as_f64().unwrap_or(0.0) / 100.0
                ),
                (Some(v), _) => format!("{sku}: {} in stock.", v["available"]),
                (None, Outcome::Timeout) => format!("{sku}: {} ran out of time.", r.call.tool),
                (None, Outcome::Refused) => {
                    format!("{sku}: {} was not run (tool budget used up).", r.call.tool)
                }
                (None, _) => format!(
                    "{sku}: {} failed ({}).",
                    r.call.tool,
                    r.call.error.as_deref().unwrap_or("unknown error")
                ),
            }
        })
        .collect();
    lines.join(" ")
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    /// A message the document calls blank is one the handler refuses, and no other:
    /// the pattern matches a single character exactly when it is not whitespace.
    #[test]
    fn the_documented_pattern_is_the_handlers_blank_test() {
        let schema = <super::ChatRequest as utoipa::PartialSchema>::schema();
        let schema = serde_json::to_value(schema).unwrap();
        let pattern = schema["properties"]["message"]["pattern"].as_str().unwrap();
        let regex = regex_automata::meta::Regex::new(pattern).unwrap();
        for c in (0..=u32::from(char::MAX)).filter_map(char::from_u32) {
            let mut buffer = [0; 4];
            let text: &str = c.encode_utf8(&mut buffer);
            assert_eq!(regex.is_match(text), !c.is_whitespace(), "{c:?}");
        }
    }
}
