//! orders-service: the ingress of the demo, where a client's budget enters the system.
//!
//! A `POST /api/orders` spends its budget in named stages, each bounded by what is left:
//!
//! ```text
//! ingress ─▶ catalog_pool ─▶ catalog ─▶ db_pool ─▶ db (set timeouts, insert, decrement, commit)
//! ```
//!
//! With `ORDERS_PRECHECKS` set, each configured check (`{name}_pool ─▶ {name}`) runs
//! between the catalog and the database.
//!
//! # Module map
//!
//! - [`config`]: settings from the environment and `--flags`.
//! - [`mode`]: legacy, observe or propagate, switched at run time; [`budget`]: what a
//!   request may spend in it; [`legacy`]: the service without the technique.
//! - [`catalog`]: the catalog client: a [`BudgetedClient`](deadline_propagation::client::BudgetedClient)
//!   that looks up prices under the request's deadline.
//! - [`orders`]: validation and the order transaction (stock decrement and insert commit
//!   together; `Idempotency-Key` makes retries safe).
//! - [`prechecks`]: extra downstreams named by configuration (`ORDERS_PRECHECKS`) that
//!   each order must pass before it is written.
//! - [`assistant`]: tool calls for AI assistants under numeric budgets: the chat
//!   endpoint and the MCP server.
//! - [`routes`]: the HTTP API, health and readiness; [`health`]: what readiness asks
//!   (started, not draining) and what it does not (the dependencies).
//! - [`shipments`]: `POST /api/orders/{id}/shipments`, the queue hop: a job on a queue
//!   in this database, carrying the budget to shipping-worker.
//! - [`admin`]: `GET|PUT /admin/mode` on the admin address: the rollout switch.
//!
//! `DEADLINE_MODE=legacy` runs the same handlers without the technique, for the
//! before/after experiment; `observe` runs it all but refuses nothing. The mode
//! switches at run time through the admin API.

pub mod admin;
pub mod app;
pub mod assistant;
pub mod budget;
pub mod catalog;
pub mod config;
pub mod health;
pub mod legacy;
pub mod mode;
pub mod orders;
pub mod prechecks;
pub mod routes;
pub mod shipments;
pub mod state;
pub mod store;

pub use app::{Application, MIGRATOR};
pub use budget::Budget;
pub use catalog::CatalogClient;
pub use config::{Config, Mode};
pub use mode::ModeSwitch;
pub use state::AppState;
