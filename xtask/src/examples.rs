//! `cargo xtask examples`: the crate's example ladder, each run and asked over HTTP.
//!
//! An example that compiles can still answer 200 where the README promises a 504. So each
//! runs as its reader would run it (its binary, a real port, the catalog and PostgreSQL
//! where needed) and is asked what its doc comment says, the answer checked: status, the
//! stage in the problem body, `Server-Timing`, and how long it took.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde_json::Value;
use test_support::process::{binary_dir, free_port};
use test_support::{PgCluster, ServiceProcess};

use crate::run::set_fault;
use crate::scenario::delay;
use crate::stack::{fresh_database, run, start_catalog, wait_listening, workspace};

/// How much later than its budget an answer may come on a loaded 2-core machine.
const LATE: Duration = Duration::from_millis(400);

/// Builds (unless `no_build`) and runs every example of the ladder.
pub async fn examples(profile: &str, no_build: bool) -> anyhow::Result<()> {
    if !no_build {
        let packages = "-p deadline-propagation --examples --features deadline-propagation/full";
        run(
            Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
                .current_dir(workspace())
                .args(["build", "--quiet", "--profile", profile])
                .args(packages.split(' '))
                .args(["-p", "catalog-service"]),
        )?;
    }
    let bin = binary_dir(&workspace(), profile);
    let logs = std::env::temp_dir().join(format!("examples-{}", std::process::id()));
    std::fs::create_dir_all(&logs)?;
    readme_shows_the_example(&workspace())?;
    ingress(&bin, &logs).await.context("example `ingress`")?;
    client(&bin, &logs).await.context("example `client`")?;
    let database = database(&bin, &logs).await;
    database.context("examples `database` and `readme`")?;
    println!("examples: ingress, client, database and readme answered as documented");
    Ok(())
}

/// The line before the README's Rust block that is `shared/examples/readme.rs`.
const README_MARKER: &str = "<!-- the file shared/examples/readme.rs, without its doc comment -->";

/// The README's Rust block is the `readme` example: what a reader pastes, CI runs.
pub fn readme_shows_the_example(workspace: &Path) -> anyhow::Result<()> {
    let readme = std::fs::read_to_string(workspace.join("README.md"))?;
    let example = std::fs::read_to_string(workspace.join("shared/examples/readme.rs"))?;
    let code: String = example
        .lines()
        .skip_while(|line| line.starts_with("//!") || line.is_empty())
        .flat_map(|line| [line, "\n"])
        .collect();
    let block = readme
        .split_once(&format!("{README_MARKER}\n```rust\n"))
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .map(|(block, _)| block)
        .with_context(|| format!("README.md has no ```rust block after {README_MARKER}"))?;
    ensure!(
        block == code,
        "README.md's Rust block is not shared/examples/readme.rs (without its doc comment): \
         copy the file's text into the README"
    );
    Ok(())
}

/// Step 1: a 300 ms budget on a 500 ms route is a 504 at 300 ms; no budget (1 s) is 200.
async fn ingress(bin: &Path, logs: &Path) -> anyhow::Result<()> {
    let (url, _example) = start(&bin.join("examples/ingress"), &[], logs).await?;
    let cut = ask(&format!("{url}/slow"), Some(300)).await?;
    cut.expect_deadline(300, &["work", "ingress"])?;
    let done = ask(&format!("{url}/slow"), None).await?;
    ensure!(done.status == 200, "no budget header: {done:?}");
    Ok(())
}

/// Step 2: the 1 s downstream is cut at the caller's 300 ms and named; with 1.5 s the
/// call completes, and the downstream was told the budget.
async fn client(bin: &Path, logs: &Path) -> anyhow::Result<()> {
    let (url, _example) = start(&bin.join("examples/client"), &[], logs).await?;
    let cut = ask(&format!("{url}/reserve"), Some(300)).await?;
    cut.expect_deadline(300, &["inventory"])?;
    ensure!(
        cut.server_timing.contains("inventory;dur="),
        "Server-Timing names the call: {cut:?}"
    );
    let done = ask(&format!("{url}/reserve"), Some(1500)).await?;
    ensure!(done.status == 200, "a budget that fits: {done:?}");
    ensure!(done.body.contains("my budget was"), "{done:?}");
    Ok(())
}

/// Step 3, with the real catalog and PostgreSQL: a priced item; with the catalog 1 s
/// slow, a 504 `catalog` at 300 ms; the client's metrics. And the README's example: an
/// order written at the catalog's price, then a 504 `catalog` that wrote nothing.
async fn database(bin: &Path, logs: &Path) -> anyhow::Result<()> {
    let cluster = tokio::task::spawn_blocking(PgCluster::start).await??;
    let database_url = fresh_database(&cluster, "examples").await?;
    let orders = orders_table(&database_url).await?;
    let (catalog_port, admin_port) = (free_port(), free_port());
    let log = logs.join("catalog.log");
    let catalog = start_catalog(bin, (catalog_port, admin_port), &[], log)
        .await
        .context("catalog-service")?;
    let env = [
        ("CATALOG_URL", format!("http://127.0.0.1:{catalog_port}")),
        ("DATABASE_URL", database_url),
    ];
    let (url, _example) = start(&bin.join("examples/database"), &env, logs).await?;
    let (readme_url, _readme) = start(&bin.join("examples/readme"), &env, logs).await?;
    let priced = ask(&format!("{url}/price/SKU-00042"), Some(1000)).await?;
    ensure!(priced.status == 200, "{priced:?}");
    let body: Value = serde_json::from_str(&priced.body)?;
    ensure!(
        body["item"]["sku"] == "SKU-00042" && body["checked_at"].is_string(),
        "{body}"
    );

    // The README's order: 201, and its row in the table at the catalog's price.
    let order = post(&format!("{readme_url}/orders/SKU-00042"), Some(1000)).await?;
    ensure!(order.status == 201, "{order:?}");
    let id: i64 = order.body.trim().trim_start_matches("order ").parse()?;
    let row: (String, i32) =
        sqlx::query_as("SELECT sku, unit_price_cents FROM orders WHERE id = $1")
            .bind(id)
            .fetch_one(&orders)
            .await
            .context("the README's order is not in the table")?;
    ensure!(
        row == (
            "SKU-00042".to_owned(),
            body["item"]["price_cents"].as_i64().unwrap_or(-1) as i32
        ),
        "{row:?}, {body}"
    );

    set_fault(&crate::stack::url(admin_port), Some(delay(1000))).await?;
    let cut = ask(&format!("{url}/price/SKU-00042"), Some(300)).await?;
    cut.expect_deadline(300, &["catalog"])?;
    // With the catalog slow: a 504 naming it, and no row written.
    let cut = post(&format!("{readme_url}/orders/SKU-00042"), Some(300)).await?;
    cut.expect_deadline(300, &["catalog"])?;
    let count = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM orders").fetch_one(&orders);
    let count = count.await?;
    ensure!(
        count == 1,
        "{count} orders after a 504: nothing may be written"
    );

    let metrics = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    ensure!(
        metrics.contains(r#"http_client_requests_seconds_count{client="catalog""#),
        "the client's metrics on /metrics"
    );
    drop(catalog);
    Ok(())
}

/// A pool on `url` with orders-service's tables made there by its migrations.
async fn orders_table(url: &str) -> anyhow::Result<sqlx::PgPool> {
    let pool = sqlx::PgPool::connect(url).await?;
    let migrations = workspace().join("orders-service/migrations");
    sqlx::migrate::Migrator::new(migrations)
        .await?
        .run(&pool)
        .await?;
    Ok(pool)
}

/// Starts an example on a free port with `env`; returns its URL once it answers.
async fn start(
    binary: &Path,
    env: &[(&str, String)],
    logs: &Path,
) -> anyhow::Result<(String, ServiceProcess)> {
    ensure!(
        binary.is_file(),
        "{} is missing: cargo build --examples",
        binary.display()
    );
    let port = free_port();
    let mut env = env.to_vec();
    env.push(("LISTEN_ADDR", format!("127.0.0.1:{port}")));
    let name = binary.file_name().unwrap_or_default().to_string_lossy();
    let mut process = ServiceProcess::start(binary, &env, logs.join(format!("{name}.log")))?;
    wait_listening(port, &mut process).await?;
    Ok((format!("http://127.0.0.1:{port}"), process))
}

/// One answer, as a client saw it.
#[derive(Debug)]
struct Answer {
    status: u16,
    took: Duration,
    content_type: String,
    server_timing: String,
    body: String,
}

impl Answer {
    /// A 504 problem naming one of `stages`, answered at the budget.
    fn expect_deadline(&self, budget_ms: u64, stages: &[&str]) -> anyhow::Result<()> {
        ensure!(self.status == 504, "expected 504: {self:?}");
        ensure!(
            self.content_type == "application/problem+json",
            "a problem body: {self:?}"
        );
        let problem: Value = serde_json::from_str(&self.body)?;
        let stage = problem["stage"].as_str().unwrap_or_default();
        ensure!(stages.contains(&stage), "stage {stage:?}: {problem}");
        ensure!(problem["budget_ms"] == budget_ms, "{problem}");
        let budget = Duration::from_millis(budget_ms);
        ensure!(
            self.took >= budget - Duration::from_millis(5) && self.took < budget + LATE,
            "answered after {:?} with a {budget:?} budget",
            self.took
        );
        ensure!(
            self.server_timing.contains("total;dur="),
            "Server-Timing: {self:?}"
        );
        Ok(())
    }
}

async fn ask(url: &str, budget_ms: Option<u64>) -> anyhow::Result<Answer> {
    send(reqwest::Client::new().get(url), budget_ms).await
}

async fn post(url: &str, budget_ms: Option<u64>) -> anyhow::Result<Answer> {
    send(reqwest::Client::new().post(url), budget_ms).await
}

async fn send(request: reqwest::RequestBuilder, budget_ms: Option<u64>) -> anyhow::Result<Answer> {
    let mut request = request.timeout(Duration::from_secs(10));
    if let Some(ms) = budget_ms {
        request = request.header("X-Request-Timeout-Ms", ms);
    }
    let started = Instant::now();
    let response = request.send().await?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (content_type, server_timing) = (header("content-type"), header("server-timing"));
    let status = response.status().as_u16();
    let body = response.text().await?;
    Ok(Answer {
        status,
        took: started.elapsed(),
        content_type,
        server_timing,
        body,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_readme_shows_the_readme_example() {
        super::readme_shows_the_example(&crate::stack::workspace()).unwrap();
    }
}
