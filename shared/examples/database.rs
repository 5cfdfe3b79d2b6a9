//! Step 3 of the ladder, a whole service under the deadline: one route, one call to the
//! catalog through the budgeted client, one query through the database envelope, and
//! the metrics of all three on `GET /metrics`. Run it against the catalog and any
//! PostgreSQL (the query reads no table):
//!
//! ```sh
//! cargo run -p catalog-service &    # or CATALOG_URL=... for one elsewhere
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres \
//!     cargo run -p deadline-propagation --example database --features http-client,sqlx,metrics
//! curl -i -H 'X-Request-Timeout-Ms: 300' http://127.0.0.1:8090/price/SKU-00042
//! ```

use std::time::Duration;

use axum::extract::{Path, State};
use axum::{Json, Router, routing::get};
use deadline_propagation::client::{BudgetedClient, ClientConfig};
use deadline_propagation::db::{Db, DbConfig};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Downstream, Problem};
use serde_json::{Value, json};

// The layer put the request's `Deadline` into it; handlers take it as an argument and
// hand it to every step, so each step gets only what is left.
async fn price(
    State((catalog, db)): State<(BudgetedClient, Db)>,
    deadline: Deadline,
    Path(sku): Path<String>,
) -> Result<Json<Value>, Problem> {
    // The client takes a path that is already safe to put into a URL.
    if !sku.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(Problem::not_found(format!("no item {sku:?}")));
    }
    // Pool wait + request + body under one deadline; the catalog gets what is left
    // minus the reserve in `X-Request-Timeout-Ms`. Its errors become 503/504/502/404.
    let path = format!("/catalog/{sku}");
    let item: Value = catalog.get_json(&deadline, &path).await?;
    // The pool wait and the statement share the rest: statement_timeout is what is left
    // after the wait, so PostgreSQL stops at the deadline too.
    let checked_at: String = db
        .read(&deadline, |conn| {
            Box::pin(sqlx::query_scalar("SELECT now()::text").fetch_one(conn))
        })
        .await?;
    Ok(Json(json!({ "item": item, "checked_at": checked_at })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Never more than 2 s whatever a client asks for; 1 s when it sends no budget.
    let policy = DeadlinePolicy::from_millis(2000, 1000);
    let metrics = Metrics::new("example");
    let url = std::env::var("CATALOG_URL").unwrap_or("http://127.0.0.1:8081".into());
    let mut catalog = ClientConfig::new(Downstream::new("catalog")?, url); // catalog_pool, catalog
    catalog.max_connections = 32;
    catalog.pending_max = 64;
    catalog.acquire_timeout = Duration::from_millis(40); // a full pool answers 503 fast
    catalog.idle_timeout = Duration::from_secs(2); // under the catalog's 5 s idle close
    let catalog = BudgetedClient::new(catalog)?.with_metrics(&metrics);
    // The defaults keep the server's own bounds for a silent network.
    let mut db = DbConfig::default();
    db.max_connections = 10;
    db.acquire_timeout = Duration::from_millis(250);
    let url = std::env::var("DATABASE_URL")?;
    let db = Db::connect_lazy(&url, db)?.with_metrics(&metrics);
    let app = Router::new()
        .route("/price/{sku}", get(price))
        .with_state((catalog, db));
    // The deadline layer on every route, the HTTP metrics around it, and GET /metrics.
    let app = deadline_propagation::instrument(app, DeadlineLayer::new(policy), &metrics);
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:8090".into());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
