//! PostgreSQL, catalog-service, orders-service and shipping-worker on free loopback ports
//! (and, for the three-hop scenarios, pricing-service behind the catalog): the stack the experiment
//! measures and `cargo xtask stack -- <command>` lends to outside checks.
//!
//! PostgreSQL comes from test-support's [`PgCluster`] and the services from its
//! [`ServiceProcess`], the same code the tests use. Every value is dropped in reverse
//! order of creation, so the services stop before the database they hold connections to.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use test_support::postgres::create_database;
use test_support::process::{binary_dir, free_port};
use test_support::{PgCluster, ServiceProcess};

/// The workspace root (xtask lives one folder below it).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

/// The commit the figures speak for: `HEAD`, `-dirty` when code differs from it (results
/// folders do not count: publishing a run while another's wait to be committed is fine).
pub fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(workspace())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".to_owned();
    };
    let changes = git(&[
        "status",
        "--porcelain",
        "--",
        ".",
        ":(exclude)docs/results",
        ":(exclude)results",
    ]);
    match changes {
        Some(changes) if changes.is_empty() => head,
        _ => format!("{head}-dirty"),
    }
}

/// Builds both services for `profile` with the cargo `features` both have (`profiling`).
pub fn build_services(profile: &str, features: &[&str]) -> anyhow::Result<()> {
    let mut command = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
    command
        .current_dir(workspace())
        .args(["build", "--quiet", "--profile", profile])
        .args(["-p", "catalog-service", "-p", "pricing-service"])
        .args(["-p", "orders-service", "-p", "shipping-worker"]);
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    let status = command.status().context("cannot run cargo build")?;
    anyhow::ensure!(status.success(), "cargo build failed");
    Ok(())
}

/// Runs `command`; an error names it when it fails.
pub fn run(command: &mut std::process::Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {command:?}"))?;
    ensure!(status.success(), "{command:?} failed: {status}");
    Ok(())
}

/// `program` as found on the `PATH`.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// The loopback ports of one stack, chosen once so a Prometheus beside it scrapes every
/// run at the same addresses: each service's public port, shipping-worker's `/metrics`.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub orders: u16,
    pub catalog: u16,
    /// catalog-service's admin port (fault injection).
    pub admin: u16,
    /// orders-service's admin port (the mode; a CPU profile with `profiling`).
    pub orders_admin: u16,
    /// pricing-service's gRPC port (the third hop, where a scenario has it).
    pub pricing: u16,
    /// pricing-service's admin port: its faults and its `/metrics`.
    pub pricing_admin: u16,
    pub shipping: u16,
}

impl Ports {
    /// Ports free now.
    pub fn free() -> Self {
        Self {
            orders: free_port(),
            catalog: free_port(),
            admin: free_port(),
            orders_admin: free_port(),
            pricing: free_port(),
            pricing_admin: free_port(),
            shipping: free_port(),
        }
    }
}

/// `http://127.0.0.1:<port>`.
pub fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// The services on one database, and where they listen; orders-service declared first:
/// dropped, so stopped, first. pricing-service runs where the catalog calls it.
pub struct Services {
    pub orders: ServiceProcess,
    pub shipping: Option<ServiceProcess>,
    pub catalog: ServiceProcess,
    pub pricing: Option<ServiceProcess>,
    pub ports: Ports,
    pub database_url: String,
}

/// What differs between two starts of the services: each one's extra settings, and
/// whether pricing-service starts, the catalog pointed at it (`PRICING_URL`).
#[derive(Debug, Clone, Default)]
pub struct ServiceEnv {
    pub orders: Vec<(String, String)>,
    pub catalog: Vec<(String, String)>,
    pub pricing: bool,
    pub shipping: Vec<(String, String)>,
}

impl Services {
    /// Starts pricing-service (if asked), catalog-service then orders-service, logs in
    /// `log_dir`, and waits until orders-service's `/readyz` answers 200.
    pub async fn start(
        profile: &str,
        ports: Ports,
        database_url: String,
        env: &ServiceEnv,
        log_dir: &Path,
    ) -> anyhow::Result<Self> {
        let bin = binary_dir(&workspace(), profile);
        let pricing = env.pricing.then_some("pricing-service");
        for name in ["catalog-service", "orders-service", "shipping-worker"]
            .into_iter()
            .chain(pricing)
        {
            anyhow::ensure!(
                bin.join(name).is_file(),
                "{} is missing: cargo build --profile {profile}",
                bin.join(name).display()
            );
        }
        std::fs::create_dir_all(log_dir)?;
        let pricing = match env.pricing {
            true => Some(start_pricing(&bin, ports, log_dir.join("pricing.log")).await?),
            false => None,
        };
        let mut catalog_env: Vec<_> = env
            .catalog
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        if pricing.is_some() {
            catalog_env.push(("PRICING_URL", url(ports.pricing)));
        }
        let (ports_catalog, log) = ((ports.catalog, ports.admin), log_dir.join("catalog.log"));
        let catalog = start_catalog(&bin, ports_catalog, &catalog_env, log).await?;
        let mut orders_env = vec![
            ("ORDERS_LISTEN_ADDR", format!("127.0.0.1:{}", ports.orders)),
            (
                "ORDERS_ADMIN_ADDR",
                format!("127.0.0.1:{}", ports.orders_admin),
            ),
            ("CATALOG_URL", url(ports.catalog)),
            ("DATABASE_URL", database_url.clone()),
        ];
        orders_env.extend(env.orders.iter().map(|(k, v)| (k.as_str(), v.clone())));
        let orders = ServiceProcess::start(
            &bin.join("orders-service"),
            &orders_env,
            log_dir.join("orders.log"),
        )?;
        let mut services = Self {
            orders,
            shipping: None,
            catalog,
            pricing,
            ports,
            database_url,
        };
        services.wait_ready(Duration::from_secs(60)).await?;
        // After orders-service, whose migrations make the queue's tables.
        let mut shipping_env = vec![
            (
                "SHIPPING_LISTEN_ADDR",
                format!("127.0.0.1:{}", ports.shipping),
            ),
            ("DATABASE_URL", services.database_url.clone()),
        ];
        shipping_env.extend(env.shipping.iter().map(|(k, v)| (k.as_str(), v.clone())));
        let log = log_dir.join("shipping.log");
        let mut shipping = ServiceProcess::start(&bin.join("shipping-worker"), &shipping_env, log)?;
        wait_listening(ports.shipping, &mut shipping).await?;
        services.shipping = Some(shipping);
        Ok(services)
    }

    /// Polls `/readyz` (started and migrated) every 100 ms.
    async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let url = format!("{}/readyz", url(self.ports.orders));
        let started = Instant::now();
        while started.elapsed() < limit {
            let pricing = self.pricing.as_mut().map(|p| ("pricing", p));
            let all = [("orders", &mut self.orders), ("catalog", &mut self.catalog)];
            for (name, process) in all.into_iter().chain(pricing) {
                if let Some(status) = process.exited() {
                    bail!(
                        "{name}-service exited ({status}):\n{}",
                        process.log_tail(20)
                    );
                }
            }
            let ready = client
                .get(&url)
                .timeout(Duration::from_secs(1))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "orders-service was not ready after {limit:?}:\n{}",
            self.orders.log_tail(20)
        )
    }

    /// Graceful stop: SIGTERM to orders (it drains), the worker, the catalog, pricing.
    pub fn stop(mut self) {
        self.orders.stop(Duration::from_secs(5));
        if let Some(shipping) = &mut self.shipping {
            shipping.stop(Duration::from_secs(5));
        }
        self.catalog.stop(Duration::from_secs(5));
        if let Some(pricing) = &mut self.pricing {
            pricing.stop(Duration::from_secs(5));
        }
    }
}

/// catalog-service on `port` and `admin` (its fault API), once it accepts connections.
pub async fn start_catalog(
    bin: &Path,
    (port, admin): (u16, u16),
    env: &[(&str, String)],
    log: PathBuf,
) -> anyhow::Result<ServiceProcess> {
    let mut all = vec![
        ("CATALOG_LISTEN_ADDR", format!("127.0.0.1:{port}")),
        ("CATALOG_ADMIN_ADDR", format!("127.0.0.1:{admin}")),
    ];
    all.extend_from_slice(env);
    let mut process = ServiceProcess::start(&bin.join("catalog-service"), &all, log)?;
    wait_listening(port, &mut process).await?;
    Ok(process)
}

/// pricing-service on its `ports`, once it accepts connections.
async fn start_pricing(bin: &Path, ports: Ports, log: PathBuf) -> anyhow::Result<ServiceProcess> {
    let env = pricing_env(ports);
    let mut process = ServiceProcess::start(&bin.join("pricing-service"), &env, log)?;
    wait_listening(ports.pricing, &mut process).await?;
    Ok(process)
}

/// pricing-service's settings. Only the catalog calls it, so it honours the observe
/// marker as compose and Kubernetes run it: else observe mode meets pricing's budget.
fn pricing_env(ports: Ports) -> Vec<(&'static str, String)> {
    let addr = |port| format!("127.0.0.1:{port}");
    vec![
        ("PRICING_LISTEN_ADDR", addr(ports.pricing)),
        ("PRICING_ADMIN_ADDR", addr(ports.pricing_admin)),
        ("PRICING_HONOUR_OBSERVE", "true".to_owned()),
        ("RUST_LOG", "warn".to_owned()),
    ]
}

/// Waits until `process` accepts connections on `port`; fails if it exits first.
pub async fn wait_listening(port: u16, process: &mut ServiceProcess) -> anyhow::Result<()> {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if let Some(status) = process.exited() {
            bail!("exited ({status}):\n{}", process.log_tail(20));
        }
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "not listening after 30 s:\n{}",
            process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A new, empty database named `name` on `cluster`.
pub async fn fresh_database(cluster: &PgCluster, name: &str) -> anyhow::Result<String> {
    create_database(&cluster.url("postgres"), name).await
}

/// `cargo xtask stack -- <command>`: the command run with the stack's addresses in its
/// environment; stops everything and returns the command's exit code.
pub async fn run_with_stack(
    profile: &str,
    env: &ServiceEnv,
    log_dir: &Path,
    command: &[String],
) -> anyhow::Result<i32> {
    let (program, args) = command.split_first().context("no command given after --")?;
    let cluster = tokio::task::spawn_blocking(PgCluster::start).await??;
    let database_url = fresh_database(&cluster, "stack").await?;
    let services = Services::start(profile, Ports::free(), database_url, env, log_dir).await?;
    let ports = services.ports;
    eprintln!(
        "stack: orders {}, catalog {}, logs in {}",
        url(ports.orders),
        url(ports.catalog),
        log_dir.display()
    );
    let status = tokio::process::Command::new(program)
        .args(args)
        .env("ORDERS_URL", url(ports.orders))
        .env("ORDERS_ADMIN_URL", url(ports.orders_admin))
        .env("ORDERS_PID", services.orders.pid().to_string())
        .env("CATALOG_URL", url(ports.catalog))
        .env("CATALOG_ADMIN_URL", url(ports.admin))
        .env("DATABASE_URL", &services.database_url)
        .env("STACK_LOG_DIR", log_dir)
        .status()
        .await
        .with_context(|| format!("cannot run {program}"))?;
    // An outside check must not pass against a service that died during it.
    let mut services = services;
    let mut code = status.code().unwrap_or(1);
    for (name, process) in [
        ("orders", &mut services.orders),
        ("catalog", &mut services.catalog),
    ] {
        if let Some(exit) = process.exited() {
            eprintln!(
                "stack: {name}-service exited during the command ({exit}):\n{}",
                process.log_tail(20)
            );
            code = code.max(1);
        }
    }
    services.stop();
    drop(cluster);
    Ok(code)
}

#[cfg(test)]
mod tests {
    /// The harness starts pricing as docker-compose.yml does: it honours the marker.
    #[test]
    fn pricing_honours_the_observe_marker_as_in_compose() {
        let compose = std::fs::read_to_string(super::workspace().join("docker-compose.yml"));
        assert!(
            compose
                .unwrap()
                .contains("PRICING_HONOUR_OBSERVE: \"true\"")
        );
        let env = super::pricing_env(super::Ports::free());
        assert!(env.contains(&("PRICING_HONOUR_OBSERVE", "true".to_owned())));
    }
}
