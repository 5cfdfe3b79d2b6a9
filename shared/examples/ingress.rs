//! Step 1 of the ladder, the ingress alone: a client's budget becomes a deadline, and a
//! slow route answers 504 when the budget runs out, not when its work would finish.
//!
//! ```sh
//! cargo run -p deadline-propagation --example ingress
//! curl -i -H 'X-Request-Timeout-Ms: 300' localhost:3000/slow   # 504 after 300 ms
//! curl -i localhost:3000/slow                                    # 200 after 500 ms
//! ```

use std::time::Duration;

use axum::{Router, routing::get};
use deadline_propagation::{Deadline, DeadlineLayer, DeadlinePolicy, Problem, Stage};

/// The name the 504 and `Server-Timing` give this route's work.
const WORK: Stage = Stage::named("work");

async fn slow(deadline: Deadline) -> Result<&'static str, Problem> {
    // Half a second of work, run under what is left of the budget: `?` turns a
    // budget that ran out into the 504 problem.
    let work = tokio::time::sleep(Duration::from_millis(500));
    deadline.run(WORK, work).await?;
    Ok("done\n")
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // At most 2 s whatever a client asks for; 1 s when it sends no budget.
    let layer = DeadlineLayer::new(DeadlinePolicy::from_millis(2000, 1000));
    let app = Router::new().route("/slow", get(slow)).route_layer(layer);
    let addr = std::env::var("LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await
}
