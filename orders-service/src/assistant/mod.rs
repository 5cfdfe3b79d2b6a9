//! Tool calls for AI assistants, under numeric budgets (docs/design.md §6).
//!
//! The same two read-only tools are offered two ways:
//! - `POST /api/assistant/chat` ([`chat`]): a [`Planner`] reads the message and plans
//!   tool calls; they run one after another under a [`ToolBudget`](deadline_propagation::tools::ToolBudget)
//!   (2 s turn, 800 ms per tool, at most 3 calls), and the answer lists every call with
//!   its outcome, partial results included.
//! - MCP at `/mcp` ([`mcp`]): each `tools/call` runs under the per-tool cap, and an MCP
//!   cancellation stops the tool's HTTP request and SQL statement, not only the transport.
//!
//! # Module map
//! - [`tool`]: `catalog_lookup` and `inventory_check`, as a client sees them; [`tools`]:
//!   each one's I/O, under the budget it is given.
//! - [`planner`]: the rule-based planner (the stand-in for a language model) and an
//!   OpenAI-compatible one.
//! - [`chat`]: the chat endpoint.
//! - [`mcp`]: the MCP server.

pub mod chat;
pub mod mcp;
pub mod planner;
pub mod tool;
pub mod tools;

pub use planner::Planner;
pub use tool::Tool;
