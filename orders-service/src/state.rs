//! [`AppState`]: what every handler shares, and the database as handlers reach it.

use deadline_propagation::db::Db;
use deadline_propagation::metrics::Metrics;

use crate::assistant::planner::Assistant;
use crate::catalog::CatalogClient;
use crate::health::{Checked, Health};
use crate::legacy::PlainDb;
use crate::mode::ModeSwitch;
use crate::prechecks::Prechecks;
use crate::shipments::Shipments;
use crate::store::Store;

/// What every handler shares.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The budgeted catalog client.
    pub catalog: CatalogClient,
    /// The configured prechecks (none by default).
    pub prechecks: Prechecks,
    /// The database under the deadline.
    pub db: Db,
    /// The database as legacy mode reaches it: a plain pool.
    pub plain_db: PlainDb,
    /// This service's metrics.
    pub metrics: Metrics,
    /// Assistant budgets and planner.
    pub assistant: Assistant,
    /// The mode in force, switched by the admin API.
    pub mode: ModeSwitch,
    /// Whether the service drains, and its dependencies' gauges.
    pub health: Health,
    /// The shipments' queue.
    pub shipments: Shipments,
}

impl AppState {
    /// What a check of the dependencies asks.
    pub fn checked(&self) -> Checked {
        Checked {
            health: self.health.clone(),
            db: self.db.clone(),
            catalog: self.catalog.clone(),
        }
    }

    /// The database, as handlers reach it.
    pub fn store(&self) -> Store<'_> {
        Store {
            db: &self.db,
            plain: &self.plain_db,
        }
    }
}
