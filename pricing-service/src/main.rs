//! pricing-service: see the crate docs in `lib.rs`.

use clap::Parser;
use pricing_service::{Application, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let _telemetry = service_kit::telemetry::init("pricing-service", config.log_format);
    let app = Application::build(config).await?;
    tracing::info!(
        port = app.port(),
        admin_port = app.admin_port(),
        "pricing-service listening"
    );
    app.run_until(service_kit::server::shutdown_signal()).await;
    Ok(())
}
