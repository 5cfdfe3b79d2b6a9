//! The catalog as orders-service sees it: prices, fetched under the request's deadline.

use deadline_propagation::Downstream;
use deadline_propagation::client::{BudgetedClient, ClientConfig};
use deadline_propagation::metrics::Metrics;
use deadline_propagation::{Deadline, Problem};
use serde::Deserialize;

use crate::config::Config;

/// One catalog item; only what an order needs.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct CatalogItem {
    /// The SKU.
    pub sku: String,
    /// Its name.
    pub name: String,
    /// Price in cents.
    pub price_cents: u32,
}

/// The catalog client (cheap to clone).
#[derive(Debug, Clone)]
pub struct CatalogClient {
    http: BudgetedClient,
}

impl CatalogClient {
    /// Builds the client from the service settings.
    pub fn new(config: &Config, metrics: &Metrics) -> Result<Self, reqwest::Error> {
        let base_url = config.catalog_url.trim_end_matches('/').to_owned();
        let http = pooled_client(config, service_kit::metrics::catalog(), base_url, metrics)?;
        Ok(Self { http })
    }

    /// The item for `sku` (already validated to be URL-safe). An unknown SKU is 404.
    pub async fn item(&self, deadline: &Deadline, sku: &str) -> Result<CatalogItem, Problem> {
        self.http
            .get_json(deadline, &format!("/catalog/{sku}"))
            .await
            .map_err(|err| match err {
                deadline_propagation::client::CallError::NotFound => {
                    Problem::not_found(format!("unknown sku {sku:?}"))
                }
                other => other.into_problem(self.http.downstream()),
            })
    }

    /// Whether the catalog answers `/healthz` within `deadline`.
    pub async fn ping(&self, deadline: &Deadline) -> Result<(), Problem> {
        self.http
            .get_health(deadline, "/healthz")
            .await
            .map(drop)
            .map_err(|err| err.into_problem(self.http.downstream()))
    }

    /// The underlying budgeted client (the readiness probe calls its downstream).
    pub fn http(&self) -> &BudgetedClient {
        &self.http
    }
}

/// A budgeted client for `downstream` at `base_url` with the catalog's pool settings
/// (`CATALOG_POOL_*`, `CATALOG_ADMISSION`): the catalog's own client and each
/// precheck's (`ORDERS_PRECHECKS`) are built here, each with a bulkhead of its own.
/// Its limits are exported as configured (by the client), for panels and alerts to
/// compare against.
pub(crate) fn pooled_client(
    config: &Config,
    downstream: Downstream,
    base_url: String,
    metrics: &Metrics,
) -> Result<BudgetedClient, reqwest::Error> {
    BudgetedClient::with_metrics(
        ClientConfig {
            name: downstream,
            base_url,
            max_connections: usize::try_from(config.catalog_pool_max_connections)
                .unwrap_or(usize::MAX),
            pending_max: usize::try_from(config.catalog_pool_pending_max).unwrap_or(usize::MAX),
            acquire_timeout: Config::ms(config.catalog_pool_acquire_timeout_ms),
            reserve: Config::ms(config.deadline_reserve_ms),
            admission: config.catalog_admission,
            idle_timeout: Config::ms(config.catalog_pool_idle_timeout_ms),
            // Hedged are the catalog's GETs only; a precheck's POST is not safe to
            // send twice.
            hedge: (downstream.name() == "catalog")
                .then(|| config.catalog_hedge())
                .flatten(),
            retry_budget: config.retry_budget(),
        },
        metrics,
    )
}
