//! `cargo xtask <command>`: the project's harness (`cargo xtask --help` lists the
//! commands). This binary only parses the command line and calls into the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::stack;

#[derive(Parser)]
#[command(about = "The harness of the deadline-propagation project", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start PostgreSQL, catalog-service and orders-service on free loopback ports,
    /// run COMMAND with ORDERS_URL, CATALOG_URL, CATALOG_ADMIN_URL and DATABASE_URL
    /// set, then stop everything. Exits with the command's status.
    Stack(StackArgs),
    /// Run legacy and propagate under identical load and compare them (docs/design.md §9).
    Experiment(xtask::experiment::ExperimentArgs),
    /// Check the Grafana dashboards' structure (no Prometheus needed; `experiment
    /// --prometheus` runs their queries against real series).
    Dashboards,
    /// The order transaction alone under pgbench, as legacy and as propagate send it.
    Cost(xtask::cost::CostArgs),
    /// CPU per order of each process at a fixed open-loop rate, both modes on one stack
    /// switched at run time in alternating pairs, and the same instrument A/A.
    Cpu(xtask::cpu::CpuArgs),
    /// Pool the pairs of several `cpu` runs (each folder's cpu.json) into one table, as
    /// if one run had made them all: how docs/experiment.md pools runs of one build.
    CpuPool(xtask::cpu::CpuPoolArgs),
    /// Regenerate the result tables of README.md and docs/*.md (each between a
    /// `<!-- results:DIR [FIGURE ...] -->` and a `<!-- results:end -->` line) from
    /// docs/results/DIR/summary.json.
    ReadmeTables {
        /// Change nothing; fail (exit 1) when a file's tables are not what the committed
        /// summaries give.
        #[arg(long)]
        check: bool,
    },
    /// Make the images docker-compose.yml runs (but Grafana, Jaeger and k6) without a
    /// registry: Debian's packages by debootstrap, the services from the host's build.
    Images(xtask::images::ImagesArgs),
    /// Start docker-compose.yml's PostgreSQL, catalog, orders and Prometheus, check them
    /// from the host, and take them down (the images first: `cargo xtask images`).
    ComposeCheck(xtask::compose::ComposeArgs),
    /// Run the crate's example ladder (ingress, client, database) and the README's
    /// example, and ask each what its doc comment says to ask; the database and README
    /// examples get the catalog and PostgreSQL (with orders-service's tables).
    Examples {
        /// Which build to run (`dev` is target/debug).
        #[arg(long, default_value = "dev", value_parser = ["dev", "release"])]
        profile: String,
        /// Run the binaries already built (CI: `cargo test` built the examples).
        #[arg(long)]
        no_build: bool,
    },
    /// Copy shared/ into a new project with a two-line main and build it offline.
    CopyCheck,
    /// Draw DIR/chart.svg again from DIR/timeseries.json and DIR/summary.json (the
    /// experiment draws it when it runs), e.g. for a published run under docs/results.
    Chart {
        /// An experiment's output folder.
        dir: PathBuf,
    },
    /// The queue hop under a backlog: shipments at twice the workers' capacity for a
    /// stretch, then at half; legacy against propagate, alternating (docs/design.md §11).
    Backlog(xtask::backlog::BacklogArgs),
}

#[derive(clap::Args)]
struct StackArgs {
    /// Which build of the services to run (`dev` is target/debug).
    #[arg(long, default_value = "dev", value_parser = ["dev", "release"])]
    profile: String,
    /// Extra orders-service setting, repeatable.
    #[arg(long = "orders-env", value_name = "K=V", value_parser = key_value)]
    orders_env: Vec<(String, String)>,
    /// Extra catalog-service setting, repeatable.
    #[arg(long = "catalog-env", value_name = "K=V", value_parser = key_value)]
    catalog_env: Vec<(String, String)>,
    /// Where the service logs go (default: a new folder under the temp dir).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected K=V, got {text:?}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Stack(args) => stack_command(args).await,
        Command::Experiment(args) => xtask::experiment::experiment(args)
            .await
            .map(|ok| u8::from(!ok)),
        Command::Cost(args) => xtask::cost::cost(args).await.map(|()| 0),
        Command::Cpu(args) => xtask::cpu::run(args).await.map(|_| 0),
        Command::CpuPool(args) => xtask::cpu::pool_command(&args).map(|()| 0),
        Command::Dashboards => dashboards_command(),
        Command::Images(args) => xtask::images::images(&args).map(|()| 0),
        Command::ComposeCheck(args) => xtask::compose::compose_check(&args)
            .await
            .map(|ok| u8::from(!ok)),
        Command::Examples { profile, no_build } => xtask::examples::examples(&profile, no_build)
            .await
            .map(|()| 0),
        Command::CopyCheck => xtask::copy_check::copy_check().map(|()| 0),
        Command::Chart { dir } => xtask::chart::write(&dir).map(|()| 0),
        Command::Backlog(args) => xtask::backlog::backlog(&args).await.map(|()| 0),
        Command::ReadmeTables { check } => readme_command(check),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn stack_command(args: StackArgs) -> anyhow::Result<u8> {
    let log_dir = args
        .log_dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("stack-logs-{}", std::process::id())));
    let env = stack::ServiceEnv {
        orders: args.orders_env,
        catalog: args.catalog_env,
        ..stack::ServiceEnv::default()
    };
    let code = stack::run_with_stack(&args.profile, &env, &log_dir, &args.command).await?;
    Ok(u8::try_from(code).unwrap_or(1))
}

fn dashboards_command() -> anyhow::Result<u8> {
    let dir = stack::workspace().join("grafana/dashboards");
    let report = xtask::dashboards::check_dir(&dir)?;
    for problem in &report.problems {
        println!("FAIL {problem}");
    }
    println!(
        "dashboards: {} queries, {} problems",
        report.queries.len(),
        report.problems.len()
    );
    Ok(u8::from(!report.problems.is_empty()))
}

fn readme_command(check: bool) -> anyhow::Result<u8> {
    let workspace = stack::workspace();
    let changed = xtask::tables::update(&workspace, check)?;
    for file in &changed {
        let file = file.strip_prefix(&workspace).unwrap_or(file).display();
        match check {
            true => println!("FAIL {file}: tables out of date (run `cargo xtask readme-tables`)"),
            false => println!("{file}: tables regenerated"),
        }
    }
    if changed.is_empty() {
        println!("readme-tables: every table is up to date");
    }
    Ok(u8::from(check && !changed.is_empty()))
}
