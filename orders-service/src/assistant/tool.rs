//! [`Tool`]: what an assistant may call, by name, with its description and schema.

use serde_json::{Value, json};

/// A read-only tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// The catalog entry of a SKU: one budgeted catalog call.
    CatalogLookup,
    /// The stock of a SKU: one SQL query through the database helper.
    InventoryCheck,
}

impl Tool {
    /// Every tool.
    pub const ALL: [Tool; 2] = [Tool::CatalogLookup, Tool::InventoryCheck];

    /// The name clients call it by.
    pub fn name(self) -> &'static str {
        match self {
            Tool::CatalogLookup => "catalog_lookup",
            Tool::InventoryCheck => "inventory_check",
        }
    }

    /// The tool named `name`.
    pub fn named(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|tool| tool.name() == name)
    }

    /// What it does, for the model that chooses tools.
    pub fn description(self) -> &'static str {
        match self {
            Tool::CatalogLookup => "Look up a product in the catalog: its name and price in cents.",
            Tool::InventoryCheck => "Check how many items of a product are in stock.",
        }
    }

    /// JSON Schema of the arguments: both take one SKU.
    pub fn input_schema(self) -> serde_json::Map<String, Value> {
        let schema = json!({
            "type": "object",
            "properties": {
                "sku": {
                    "type": "string",
                    "description": "The product's SKU, like SKU-00042",
                    "pattern": "^[A-Za-z0-9_-]{1,32}$"
                }
            },
            "required": ["sku"],
            "additionalProperties": false
        });
        match schema {
            Value::Object(map) => map,
            _ => unreachable!("the schema literal is an object"),
        }
    }
}
