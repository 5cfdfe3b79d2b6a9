//! The catalog as orders-service sees it: prices, fetched under the request's deadline
//! (or, in legacy, without one).

use deadline_propagation::Downstream;
use deadline_propagation::admission;
use deadline_propagation::client::{BudgetedClient, CallErrorKind, ClientConfig};
use deadline_propagation::hedging::Hedging;
use deadline_propagation::metrics::Metrics;
use deadline_propagation::retry_budget::RetryTokens;
use deadline_propagation::{Deadline, Problem};
use http::{Method, StatusCode};
use serde::Deserialize;
use tokio::time::Instant;

use crate::budget::Budget;
use crate::config::{Admission, Config};
use crate::legacy::{Failure, PlainClient};

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
    plain: PlainClient,
}

impl CatalogClient {
    /// Builds the client from the service settings.
    pub fn new(config: &Config, metrics: &Metrics) -> Result<Self, reqwest::Error> {
        let base_url = config.catalog_url.trim_end_matches('/').to_owned();
        let http = pooled_client(config, service_kit::metrics::catalog(), base_url, metrics)?;
        let plain = PlainClient::new(&http, metrics)?;
        Ok(Self { http, plain })
    }

    /// The item for `sku` (already validated to be URL-safe). An unknown SKU is 404.
    pub async fn item(&self, budget: &Budget, sku: &str) -> Result<CatalogItem, Problem> {
        let path = format!("/catalog/{sku}");
        let unknown = || Problem::not_found(format!("unknown sku {sku:?}"));
        let deadline = match budget {
            Budget::Deadline(deadline) => deadline,
            Budget::Unbounded => {
                let started = Instant::now();
                return match self.plain.send(Method::GET, &path, None).await {
                    Ok(body) => serde_json::from_slice(&body)
                        .map_err(|err| Problem::bad_gateway(self.plain.downstream().call(), err)),
                    Err(Failure::Status(StatusCode::NOT_FOUND)) => Err(unknown()),
                    Err(failure) => Err(failure.into_problem(self.plain.downstream(), started)),
                };
            }
        };
        self.http
            .get_json(deadline, &path)
            .await
            .map_err(|err| match err.kind() {
                CallErrorKind::NotFound => unknown(),
                _ => err.into(),
            })
    }

    /// Whether the catalog answers `/healthz` within `deadline`.
    pub async fn ping(&self, deadline: &Deadline) -> Result<(), Problem> {
        self.http
            .request(Method::GET, "/healthz")
            .health_check()
            .send(deadline)
            .await
            .map(drop)
            .map_err(Problem::from)
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
    let mut client = ClientConfig::new(downstream, base_url);
    client.max_connections = u32::try_from(config.catalog_pool_max_connections).unwrap_or(u32::MAX);
    client.pending_max = u32::try_from(config.catalog_pool_pending_max).unwrap_or(u32::MAX);
    client.acquire_timeout = Config::ms(config.catalog_pool_acquire_timeout_ms);
    client.reserve = Config::ms(config.deadline_reserve_ms);
    client.idle_timeout = Config::ms(config.catalog_pool_idle_timeout_ms);
    client.max_body = usize::try_from(config.downstream_max_body_bytes).unwrap_or(usize::MAX);
    let mut client = BudgetedClient::new(client)?;
    // Hedged are the catalog's GETs only; a precheck's POST is not safe to send twice.
    // Hedging goes first: its history times extra attempts better than admission's.
    let hedge = (downstream.name() == "catalog")
        .then(|| config.catalog_hedge())
        .flatten();
    if let Some(policy) = hedge {
        client = client.plugin(Hedging::new(policy));
    }
    if config.catalog_admission == Admission::Predict {
        client = client.plugin(admission::Admission::new());
    }
    let client = client.plugin(RetryTokens::new(config.retry_budget()));
    Ok(client.with_metrics(metrics))
}
