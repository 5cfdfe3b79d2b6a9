//! shipping-worker: see the crate docs in `lib.rs`.

use clap::Parser;
use shipping_worker::{Application, Config};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let _telemetry = service_kit::telemetry::init("shipping-worker", config.log_format);
    let app = Application::build(config).await?;
    tracing::info!(port = app.port(), "shipping-worker listening");
    app.run_until(service_kit::server::shutdown_signal()).await;
    Ok(())
}
