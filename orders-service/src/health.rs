//! Whether this process can serve, and how its dependencies answer: two questions.
//!
//! Readiness (`/readyz`) asks only the first: the service started (its migrations ran
//! before it listened) and is not draining. A catalog or a PostgreSQL that is slow,
//! failing or gone does not make it unready: every replica shares them, so a load
//! balancer would take every replica out at once, and the orders the service would have
//! answered quickly and honestly (a 502 naming the catalog, within the budget), or
//! served (`GET /api/orders/{id}` needs only PostgreSQL), would meet refused
//! connections instead.
//!
//! How the dependencies answer goes to people (`/health/dependencies`) and to the
//! metrics (`dependency_up`), checked every `DEPENDENCY_CHECK_EVERY_MS` under
//! [`CHECK_BUDGET`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadline_propagation::{Deadline, Problem};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use service_kit::metrics::names::DEPENDENCY_UP;

use deadline_propagation::db::Db;

use crate::catalog::CatalogClient;

/// How long one check of the dependencies may take.
pub const CHECK_BUDGET: Duration = Duration::from_millis(500);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DependencyLabels {
    service: &'static str,
    dependency: &'static str,
}

/// Whether the service drains, and the gauges of its dependencies; clones share them.
#[derive(Clone, Debug)]
pub struct Health {
    draining: Arc<AtomicBool>,
    up: Family<DependencyLabels, Gauge>,
    service: &'static str,
}

impl Health {
    /// Not draining; `dependency_up{service, dependency}` in `registry`, 0 until checked.
    pub fn new(service: &'static str, registry: &mut Registry) -> Self {
        let up = Family::<DependencyLabels, Gauge>::default();
        registry.register(
            DEPENDENCY_UP,
            "1 when the dependency answered the last check (within 500 ms), else 0",
            up.clone(),
        );
        for dependency in ["database", "catalog"] {
            let _ = up.get_or_create(&DependencyLabels {
                service,
                dependency,
            });
        }
        Self {
            draining: Arc::default(),
            up,
            service,
        }
    }

    /// From now on the service is not ready: shutdown has begun.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    fn record(&self, dependency: &'static str, answered: &Result<(), Problem>) {
        let labels = DependencyLabels {
            service: self.service,
            dependency,
        };
        self.up
            .get_or_create(&labels)
            .set(i64::from(answered.is_ok()));
    }
}

/// How each dependency answered one check.
#[derive(Debug)]
pub struct Dependencies {
    /// `SELECT 1` through the service's pool.
    pub database: Result<(), Problem>,
    /// The catalog's `/healthz`.
    pub catalog: Result<(), Problem>,
}

/// What a check asks: the service's pool and its catalog client (clones share them).
#[derive(Clone, Debug)]
pub struct Checked {
    /// Whose gauges record the answers.
    pub health: Health,
    /// The database under the deadline.
    pub db: Db,
    /// The budgeted catalog client.
    pub catalog: CatalogClient,
}

/// Asks both dependencies at once, within [`CHECK_BUDGET`] in every mode, and records
/// the answers in the gauges.
pub async fn check(of: &Checked) -> Dependencies {
    let deadline = Deadline::after(CHECK_BUDGET);
    let database = async {
        of.db
            .read(&deadline, |conn| {
                Box::pin(async move { sqlx::query("SELECT 1").execute(conn).await.map(drop) })
            })
            .await
            .map_err(Problem::from)
    };
    let (database, catalog) = tokio::join!(database, of.catalog.ping(&deadline));
    of.health.record("database", &database);
    of.health.record("catalog", &catalog);
    Dependencies { database, catalog }
}

/// Checks the dependencies every `period`, for the metrics, until dropped.
pub async fn watch(of: Checked, period: Duration) {
    let mut every = tokio::time::interval(period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        check(&of).await;
    }
}
