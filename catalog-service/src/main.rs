//! catalog-service: see the crate docs in `lib.rs`.

use catalog_service::{Application, Config};
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let _telemetry = service_kit::telemetry::init("catalog-service", config.log_format);
    let app = Application::build(config).await?;
    tracing::info!(
        port = app.port(),
        admin_port = app.admin_port(),
        "catalog-service listening"
    );
    app.run_until(service_kit::server::shutdown_signal()).await;
    Ok(())
}
