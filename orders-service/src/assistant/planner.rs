//! [`Planner`]: decides which tools a message needs.
//!
//! The default is rule-based: it finds SKUs in the message and plans a catalog lookup
//! and, when the message asks about stock, an inventory check for each. It stands in for
//! a language model so the demo runs without one; what matters here is what happens to
//! the planned calls, not how clever the plan is. An OpenAI-compatible planner is
//! switched on with `ASSISTANT_LLM_URL`; its HTTP call runs under the same turn budget.

use std::time::Duration;

use anyhow::Context as _;
use deadline_propagation::tools::ToolPolicy;
use deadline_propagation::{Deadline, Problem, Stage};
use serde::Serialize;
use serde_json::{Value, json};
use service_kit::secret::Secret;

use super::tool::Tool;
use crate::config::Config;

/// A tool call the planner wants made.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedCall {
    /// Which tool.
    #[serde(serialize_with = "tool_name")]
    pub tool: Tool,
    /// Its arguments.
    pub arguments: Value,
}

fn tool_name<S: serde::Serializer>(tool: &Tool, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(tool.name())
}

/// How tool calls are planned.
#[derive(Debug, Clone)]
pub enum Planner {
    /// Rules: SKUs found in the message, price and/or stock by keywords.
    Rules,
    /// An OpenAI-compatible chat-completions endpoint with tool calling.
    OpenAi(OpenAiPlanner),
}

impl Planner {
    /// Its name in answers.
    pub fn name(&self) -> &'static str {
        match self {
            Planner::Rules => "rules",
            Planner::OpenAi(_) => "openai",
        }
    }

    /// The calls to make for `message`, planned within `turn`.
    pub async fn plan(&self, message: &str, turn: &Deadline) -> Result<Vec<PlannedCall>, Problem> {
        match self {
            Planner::Rules => Ok(plan_by_rules(message)),
            Planner::OpenAi(planner) => planner.plan(message, turn).await,
        }
    }
}

const STOCK_WORDS: [&str; 5] = ["stock", "inventory", "available", "how many", "left"];
const PRICE_WORDS: [&str; 5] = ["price", "cost", "how much", "catalog", "name"];

/// SKU-nnnnn tokens in order of appearance, each once; price unless only stock is asked
/// about, stock when asked about.
pub fn plan_by_rules(message: &str) -> Vec<PlannedCall> {
    let lower = message.to_ascii_lowercase();
    let wants_stock = STOCK_WORDS.iter().any(|w| lower.contains(w));
    let wants_price = PRICE_WORDS.iter().any(|w| lower.contains(w)) || !wants_stock;
    let mut skus: Vec<String> = Vec::new();
    let bytes = lower.as_bytes();
    let mut i = 0;
    while let Some(found) = lower[i..].find("sku-") {
        let start = i + found;
        let digits = &bytes[start + 4..];
        let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 5 {
            let sku = format!("SKU-{}", &lower[start + 4..start + 9]);
            if !skus.contains(&sku) {
                skus.push(sku);
            }
        }
        i = start + 4;
    }
    let mut plan = Vec::new();
    for sku in skus {
        if wants_price {
            plan.push(PlannedCall {
                tool: Tool::CatalogLookup,
                arguments: json!({"sku": sku}),
            });
        }
        if wants_stock {
            plan.push(PlannedCall {
                tool: Tool::InventoryCheck,
                arguments: json!({"sku": sku}),
            });
        }
    }
    plan
}

/// An OpenAI-compatible planner (`POST {url}/chat/completions` with `tools`).
#[derive(Clone, Debug)]
pub struct OpenAiPlanner {
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub url: String,
    /// Model name.
    pub model: String,
    /// Bearer token, if the endpoint needs one. Never printed.
    pub api_key: Option<Secret>,
    /// The HTTP client.
    pub http: reqwest::Client,
}

impl OpenAiPlanner {
    async fn plan(&self, message: &str, turn: &Deadline) -> Result<Vec<PlannedCall>, Problem> {
        let tools: Vec<Value> = Tool::ALL
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name(),
                    "description": tool.description(),
                    "parameters": tool.input_schema(),
                }})
            })
            .collect();
        let body = json!({
            "model": self.model,
            "messages": [
                {"role": "system", "content": "You answer questions about products by calling tools. Call only the tools you need."},
                {"role": "user", "content": message},
            ],
            "tools": tools,
            "tool_choice": "auto",
        });
        let mut request = self
            .http
            .post(format!(
                "{}/chat/completions",
                self.url.trim_end_matches('/')
            ))
            .json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        // The model's answer is part of the turn: it gets what is left of it, no more.
        let call = async {
            let response = request.send().await?.error_for_status()?;
            response.json::<Value>().await
        };
        let reply = turn
            .run(Stage::Tool, call)
            .await?
            .map_err(|err| Problem::bad_gateway(Stage::Tool, format!("planner: {err}")))?;
        Ok(parse_tool_calls(&reply))
    }
}

/// The tool calls of a chat-completions reply that name a known tool with JSON
/// arguments; anything else is ignored.
pub fn parse_tool_calls(reply: &Value) -> Vec<PlannedCall> {
    let calls = reply
        .pointer("/choices/0/message/tool_calls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    calls
        .iter()
        .filter_map(|call| {
            let tool = Tool::named(call.pointer("/function/name")?.as_str()?)?;
            let arguments =
                serde_json::from_str(call.pointer("/function/arguments")?.as_str()?).ok()?;
            Some(PlannedCall { tool, arguments })
        })
        .collect()
}

/// How long the default planner HTTP client keeps idle connections.
pub const PLANNER_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How assistant turns are planned and budgeted.
#[derive(Clone, Debug)]
pub struct Assistant {
    /// Turn, per-tool and call-count budgets.
    pub policy: ToolPolicy,
    /// Rules or an OpenAI-compatible model.
    pub planner: Planner,
}

impl Assistant {
    /// The assistant `config` sets up.
    pub fn from_config(config: &Config) -> anyhow::Result<Self> {
        let planner = match &config.assistant_llm_url {
            None => Planner::Rules,
            Some(url) => Planner::OpenAi(OpenAiPlanner {
                url: url.clone(),
                model: config.assistant_llm_model.clone(),
                api_key: config.assistant_llm_api_key.clone(),
                http: reqwest::Client::builder()
                    .pool_idle_timeout(PLANNER_IDLE_TIMEOUT)
                    .build()
                    .context("cannot build the planner's HTTP client")?,
            }),
        };
        let mut policy = ToolPolicy::default();
        policy.turn = Config::ms(config.assistant_turn_budget_ms);
        policy.per_tool = Config::ms(config.assistant_tool_budget_ms);
        policy.max_calls = config.assistant_max_tool_calls;
        Ok(Self { policy, planner })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(plan: &[PlannedCall]) -> Vec<(String, String)> {
        plan.iter()
            .map(|c| {
                (
                    c.tool.name().to_owned(),
                    c.arguments["sku"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn rules_plan_a_lookup_per_sku_and_stock_when_asked() {
        assert_eq!(
            names(&plan_by_rules(
                "What does SKU-00042 cost, and sku-00007? SKU-00042 again"
            )),
            [
                ("catalog_lookup".into(), "SKU-00042".into()),
                ("catalog_lookup".into(), "SKU-00007".into())
            ]
        );
        assert_eq!(
            names(&plan_by_rules("Is SKU-00001 in stock?")),
            [("inventory_check".into(), "SKU-00001".into())]
        );
        assert!(plan_by_rules("hello").is_empty());
        assert!(plan_by_rules("SKU-123 and SKU-").is_empty());
    }

    #[test]
    fn openai_tool_calls_are_parsed_and_unknown_ones_dropped() {
        let reply = json!({"choices": [{"message": {"tool_calls": [
            {"function": {"name": "catalog_lookup", "arguments": "{\"sku\":\"SKU-00001\"}"}},
            {"function": {"name": "rm_rf", "arguments": "{}"}},
            {"function": {"name": "inventory_check", "arguments": "not json"}},
        ]}}]});
        assert_eq!(
            names(&parse_tool_calls(&reply)),
            [("catalog_lookup".into(), "SKU-00001".into())]
        );
    }
}
