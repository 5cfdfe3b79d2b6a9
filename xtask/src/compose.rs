//! `cargo xtask compose-check`: docker-compose.yml's stack up for real, checked from the
//! host through its published ports, then taken down (docs/docker.md).
//!
//! The compose file is used as it is, with [`OVERRIDE`] pointing it at the stand-ins; only
//! the services [`crate::images`] can make without a registry are started ([`SERVICES`]).
//! Each check (`checks()`) is printed as it passes; then `down -v` must leave no container,
//! volume or network behind. On a failure the containers' logs are printed.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use crate::dashboards::SEED_QUERY;
use crate::images::{
    OVERRIDE, POSTGRES_IMAGE, PROMETHEUS_IMAGE, SERVICE_TARGETS, exists, image, inspect, stdout,
};
use crate::prometheus::instant_query;
use crate::run::set_fault;
use crate::scenario::delay;
use crate::stack::{run, workspace};

/// The services started: those `cargo xtask images` makes (not Grafana, Jaeger, k6).
pub const SERVICES: [&str; 6] = [
    "postgres",
    "pricing",
    "catalog",
    "orders",
    "shipping",
    "prometheus",
];
/// The compose project: its own, so a user's stack from this folder is left alone.
const PROJECT: &str = "deadline-compose-check";
/// The addresses docker-compose.yml publishes on the host.
const ORDERS_URL: &str = "http://127.0.0.1:8080";
const CATALOG_ADMIN_URL: &str = "http://127.0.0.1:9081";
const PROMETHEUS_URL: &str = "http://127.0.0.1:9090";
/// The slow order's budget, and how late its 504 may arrive (docker's forwarding too).
const BUDGET_MS: u64 = 300;
const BUDGET_SLACK: Duration = Duration::from_millis(50);
/// How long the stack has to become healthy, and Prometheus to have its data.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(90);

/// `cargo xtask compose-check`.
#[derive(clap::Args, Debug)]
pub struct ComposeArgs {
    /// Leave the stack running after the checks (take it down with
    /// `docker compose -p deadline-compose-check down -v`).
    #[arg(long)]
    pub keep: bool,
}

/// Runs the check; `Ok(false)` when a check failed (its logs printed).
pub async fn compose_check(args: &ComposeArgs) -> anyhow::Result<bool> {
    let compose = Compose::detect()?;
    println!("compose-check: {}", compose.program.join(" "));
    // A stack left over from an interrupted run would make `up` reuse its containers.
    compose.run(&["down", "--volumes", "--remove-orphans"])?;
    let started = Instant::now();
    let outcome = checks(&compose).await;
    if let Err(err) = &outcome {
        println!("compose-check: FAIL {err:#}\n\n==> the containers' logs");
        let _ = compose.run(&["ps"]);
        let _ = compose.run(&["logs", "--no-color", "--timestamps"]);
    }
    if args.keep {
        println!("compose-check: the stack is left running (--keep)");
        return Ok(outcome.is_ok());
    }
    // Anonymous volumes (the images' VOLUMEs) carry no compose label: name them now.
    let volumes = compose.volumes()?;
    compose.run(&["down", "--volumes"])?;
    let mut left = compose.leftovers()?;
    left.extend(
        volumes
            .into_iter()
            .filter(|v| inspect(v, "{{.Name}}").is_ok())
            .map(|v| format!("volume {v}")),
    );
    let left = left.join(", ");
    ensure!(left.is_empty(), "`down --volumes` left behind: {left}");
    println!("compose-check: ok  down --volumes left no container, volume or network");
    println!(
        "compose-check: {} in {:.0} s",
        if outcome.is_ok() { "passed" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    Ok(outcome.is_ok())
}

/// Every check against the running stack; the first failure ends them.
async fn checks(compose: &Compose) -> anyhow::Result<()> {
    // Without them compose would try to pull them, and fail with a registry error.
    let stand_ins = [POSTGRES_IMAGE, PROMETHEUS_IMAGE].map(String::from);
    for image in stand_ins.into_iter().chain(SERVICE_TARGETS.map(image)) {
        ensure!(
            exists(&image)?,
            "there is no image {image}: make the images first (cargo xtask images)"
        );
    }
    let mut up = vec!["up", "--detach", "--no-build"];
    up.extend(SERVICES);
    compose.run(&up)?;
    for service in SERVICES {
        compose.wait_healthy(service).await?;
    }
    ok("every health check passes (postgres, pricing, catalog, orders, shipping)");

    let client = reqwest::Client::new();
    let (status, _, body) = order(&client, None).await?;
    ensure!(status == 201, "an order answered {status}: {body}");
    ok("an order is created: 201");
    let shipped = client
        .post(format!("{ORDERS_URL}/api/orders/{}/shipments", body["id"]))
        .timeout(Duration::from_secs(10))
        .send()
        .await?;
    let status = shipped.status();
    let body = shipped.text().await?;
    ensure!(status == 201, "its shipment answered {status}: {body}");
    ok("its shipment is booked through the queue by shipping-worker: 201");

    set_fault(CATALOG_ADMIN_URL, Some(delay(1000))).await?;
    let slow = order(&client, Some(BUDGET_MS)).await;
    set_fault(CATALOG_ADMIN_URL, None).await?;
    let (status, elapsed, body) = slow?;
    let limit = Duration::from_millis(BUDGET_MS) + BUDGET_SLACK;
    ensure!(
        status == 504 && body["stage"] == "catalog" && elapsed <= limit,
        "with the catalog 1 s slow, a {BUDGET_MS} ms order answered {status} after {} ms \
         (expected 504, stage catalog, within {} ms): {body}",
        elapsed.as_millis(),
        limit.as_millis()
    );
    ok(&format!(
        "catalog slowed by its fault API: a {BUDGET_MS} ms order is 504 stage catalog after {} ms",
        elapsed.as_millis()
    ));

    scraped(&client).await
}

/// Prometheus scrapes the three services and the seed's p99 query returns a number (an
/// order on every poll: its `rate` needs the histogram to grow between two scrapes).
async fn scraped(client: &reqwest::Client) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut seen_up = false;
    loop {
        let up = instant_query(PROMETHEUS_URL, "up == 1", None).await;
        let up = up.unwrap_or_default();
        let jobs: Vec<&str> = up
            .iter()
            .filter_map(|s| s["metric"]["job"].as_str())
            .collect();
        let services = ["orders-service", "catalog-service", "pricing-service"];
        let both = services.iter().all(|job| jobs.contains(job));
        if both && !seen_up {
            ok("Prometheus scrapes the three services: up == 1 for each of them");
            seen_up = true;
        }
        order(client, None).await?;
        let p99 = instant_query(PROMETHEUS_URL, SEED_QUERY, None).await;
        let p99 = p99.unwrap_or_default();
        let value = p99
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite());
        if let (true, Some(value)) = (seen_up, value) {
            ok(&format!(
                "the seed's p99 query returns {:.0} ms: {SEED_QUERY}",
                value * 1000.0
            ));
            return Ok(());
        }
        if started.elapsed() > SCRAPE_TIMEOUT {
            bail!(
                "after {} s Prometheus has up == 1 for {jobs:?} and the seed's p99 query \
                 returns {p99:?}",
                SCRAPE_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `POST /api/orders` for one item, within `budget_ms`: status, time and JSON body.
async fn order(
    client: &reqwest::Client,
    budget_ms: Option<u64>,
) -> anyhow::Result<(u16, Duration, Value)> {
    let mut request = client
        .post(format!("{ORDERS_URL}/api/orders"))
        .json(&serde_json::json!({"sku": "SKU-00042", "quantity": 1}))
        .timeout(Duration::from_secs(10));
    if let Some(budget) = budget_ms {
        request = request.header("X-Request-Timeout-Ms", budget.to_string());
    }
    let started = Instant::now();
    let response = request.send().await.context("POST /api/orders")?;
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    Ok((status, started.elapsed(), body))
}

fn ok(what: &str) {
    println!("compose-check: ok  {what}");
}

/// The compose command of this machine, for docker-compose.yml and [`OVERRIDE`].
struct Compose {
    /// `docker compose` (v2) where the plugin exists, else `docker-compose` (v1).
    program: Vec<&'static str>,
}

impl Compose {
    fn detect() -> anyhow::Result<Self> {
        let works = |program: &Vec<&str>| {
            stdout(Command::new(program[0]).args(&program[1..]).arg("version")).is_ok()
        };
        let programs = [vec!["docker", "compose"], vec!["docker-compose"]];
        let program = programs.into_iter().find(works).context(
            "neither `docker compose` nor `docker-compose` works (Debian: apt-get install docker-compose)",
        )?;
        Ok(Self { program })
    }

    fn command(&self) -> Command {
        let mut command = Command::new(self.program[0]);
        command
            .args(&self.program[1..])
            .current_dir(workspace())
            .args(["--project-name", PROJECT, "--file", "docker-compose.yml"])
            .args(["--file", OVERRIDE]);
        command
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        run(self.command().args(args))
    }

    /// Waits until `service`'s container is healthy (Prometheus: running and ready).
    async fn wait_healthy(&self, service: &str) -> anyhow::Result<()> {
        let id = stdout(self.command().args(["ps", "--quiet", service]))?;
        ensure!(!id.is_empty(), "compose started no container for {service}");
        let started = Instant::now();
        loop {
            let state = inspect(
                &id,
                "{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}",
            )?;
            let ready = match state.split_once('/') {
                Some(("running", "healthy")) => true,
                Some(("running", "")) => reqwest::get(format!("{PROMETHEUS_URL}/-/ready"))
                    .await
                    .is_ok_and(|r| r.status().is_success()),
                Some(("running", _)) => false,
                _ => bail!("{service} is {state}"),
            };
            if ready {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "{service} is still {state} after {} s",
                    START_TIMEOUT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The volumes mounted in [`PROJECT`]'s containers, by name.
    fn volumes(&self) -> anyhow::Result<Vec<String>> {
        let mut volumes = Vec::new();
        for id in stdout(self.command().args(["ps", "--quiet"]))?.lines() {
            let names = inspect(id, "{{range .Mounts}}{{.Name}} {{end}}")?;
            volumes.extend(names.split_whitespace().map(str::to_owned));
        }
        Ok(volumes)
    }

    /// Containers, volumes and networks of [`PROJECT`] that still exist.
    fn leftovers(&self) -> anyhow::Result<Vec<String>> {
        let filter = format!("label=com.docker.compose.project={PROJECT}");
        let quiet = ["--quiet", "--filter", &filter];
        let mut left = Vec::new();
        for kind in [&["ps", "--all"][..], &["volume", "ls"], &["network", "ls"]] {
            let ids = stdout(Command::new("docker").args(kind).args(quiet))?;
            left.extend(ids.lines().map(|id| format!("{} {id}", kind[0])));
        }
        Ok(left)
    }
}
