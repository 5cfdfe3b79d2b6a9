//! The named steps a request's budget is spent on.
//!
//! Every 504 and 503 names the stage where the budget ran out, and the metrics are
//! labelled with it, so an operator can tell "waiting for a pooled connection" apart from
//! "the downstream itself is slow". The names are part of the contract (docs/design.md §3).

use std::fmt;

/// One step of a request that runs under the request's [`Deadline`](crate::Deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The handler as a whole, bounded by the ingress layer.
    Ingress,
    /// Waiting for a slot in the outbound HTTP bulkhead (the client's pool queue).
    CatalogPool,
    /// The catalog call itself: connect, send, headers and body.
    Catalog,
    /// Waiting for a PostgreSQL connection from the pool.
    DbPool,
    /// SQL statements, cancelled by the server at the deadline.
    Db,
    /// One tool call of an AI assistant turn.
    Tool,
}

impl Stage {
    /// Every stage, in the order a request meets them.
    pub const ALL: [Stage; 6] = [
        Stage::Ingress,
        Stage::CatalogPool,
        Stage::Catalog,
        Stage::DbPool,
        Stage::Db,
        Stage::Tool,
    ];

    /// The wire name used in problem bodies, metric labels and `Server-Timing`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Ingress => "ingress",
            Stage::CatalogPool => "catalog_pool",
            Stage::Catalog => "catalog",
            Stage::DbPool => "db_pool",
            Stage::Db => "db",
            Stage::Tool => "tool",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
