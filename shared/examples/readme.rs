//! The README's example, word for word (CI checks that the two agree, and runs it
//! against the demo's catalog and its `orders` table: `cargo xtask examples`).

use axum::extract::{Path, State};
use axum::{Router, http::StatusCode, routing::post};
use deadline_propagation::client::{BudgetedClient, ClientConfig};
use deadline_propagation::db::{Db, DbConfig, End};
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Downstream, Problem};

#[derive(serde::Deserialize)]
struct Item {
    price_cents: i32, // of the catalog's answer to `GET /catalog/{sku}`
}

async fn place_order(
    State((catalog, db)): State<(BudgetedClient, Db)>,
    deadline: Deadline, // made by the layer from the budget headers
    Path(sku): Path<String>,
) -> Result<(StatusCode, String), Problem> {
    if !sku.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(Problem::not_found(format!("no item {sku:?}"))); // a path the URL takes
    }
    // One timeout over the wait for a pooled slot, the request and its body; the
    // catalog is sent what is left, less a reserve, in `X-Request-Timeout-Ms`.
    let path = format!("/catalog/{sku}");
    let item: Item = catalog.get_json(&deadline, &path).await?;
    // `statement_timeout` from what is left after the wait for a connection, the
    // statement cancelled on the server if the caller goes away, COMMIT's answer as
    // the outcome.
    let id: i64 = db
        .transaction(&deadline, move |conn| {
            Box::pin(async move {
                let id = sqlx::query_scalar(
                    "INSERT INTO orders (sku, quantity, unit_price_cents, total_cents) \
                     VALUES ($1, 1, $2, $2) RETURNING id",
                )
                .bind(sku)
                .bind(item.price_cents)
                .fetch_one(&mut *conn)
                .await?;
                Ok(End::Commit(id))
            })
        })
        .await?; // a `?` answers 504, 503 or 502, naming the stage that ran out
    Ok((StatusCode::CREATED, format!("order {id}\n")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let catalog_url = std::env::var("CATALOG_URL").unwrap_or("http://127.0.0.1:8081".into());
    let catalog = ClientConfig::new(Downstream::new("catalog")?, catalog_url);
    let catalog = BudgetedClient::new(catalog)?; // stages catalog_pool, catalog
    let db = Db::connect_lazy(&std::env::var("DATABASE_URL")?, DbConfig::default())?; // db_pool, db
    let policy = DeadlinePolicy::from_millis(2000, 1000); // at most 2 s; 1 s by default
    let app = Router::new()
        .route("/orders/{sku}", post(place_order))
        .route_layer(DeadlineLayer::new(policy))
        .with_state((catalog, db));
    let addr = std::env::var("LISTEN_ADDR").unwrap_or("127.0.0.1:3000".into());
    axum::serve(tokio::net::TcpListener::bind(addr).await?, app).await?;
    Ok(())
}
