//! The tools: what an assistant may call, each bounded by the deadline it is handed.

use deadline_propagation::Problem;
use serde_json::{Value, json};

pub use super::tool::Tool;

use crate::AppState;
use crate::budget::Budget;
use crate::orders::validate_sku;
use service_kit::answers::Answers as _;

impl Tool {
    /// Runs the tool with `arguments`; all its I/O spends `budget`.
    pub async fn run(
        self,
        state: &AppState,
        budget: Budget,
        arguments: &Value,
    ) -> Result<Value, Problem> {
        let sku = arguments
            .get("sku")
            .and_then(Value::as_str)
            .ok_or_else(|| Problem::unprocessable("argument sku (a string) is required"))?;
        validate_sku(sku)?;
        match self {
            Tool::CatalogLookup => catalog_lookup(state, &budget, sku).await,
            Tool::InventoryCheck => inventory_check(state, &budget, sku).await,
        }
    }
}

/// The budgeted catalog call, exactly as an order makes it.
async fn catalog_lookup(state: &AppState, budget: &Budget, sku: &str) -> Result<Value, Problem> {
    let item = state.catalog.item(budget, sku).await?;
    Ok(json!({"sku": item.sku, "name": item.name, "price_cents": item.price_cents}))
}

/// One SELECT in a read-only transaction whose `statement_timeout` is the tool's budget;
/// if the tool is cancelled the statement is cancelled on the server too.
async fn inventory_check(state: &AppState, budget: &Budget, sku: &str) -> Result<Value, Problem> {
    let key = sku.to_owned();
    let available: Option<i32> = state
        .store()
        .read(budget, move |conn| {
            Box::pin(
                sqlx::query_scalar("SELECT available FROM inventory WHERE sku = $1")
                    .bind(key)
                    .fetch_optional(conn),
            )
        })
        .await?;
    match available {
        Some(available) => Ok(json!({"sku": sku, "available": available})),
        None => Err(Problem::not_found(format!("unknown sku {sku:?}"))),
    }
}
