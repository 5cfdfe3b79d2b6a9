//! The PostgreSQL pool's families.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::names::{DB_POOL_CONNECTIONS, DB_POOL_PENDING_ACQUIRES};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// `db_pool_connections{state}` and `db_pool_pending_acquires`.
#[derive(Clone, Debug)]
pub(crate) struct DbMetrics {
    connections: Family<StateLabel, Gauge>,
    pending: Gauge,
}

impl DbMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let this = Self {
            connections: Family::default(),
            pending: Gauge::default(),
        };
        registry.register(
            DB_POOL_CONNECTIONS,
            "Database pool connections by state",
            this.connections.clone(),
        );
        registry.register(
            DB_POOL_PENDING_ACQUIRES,
            "Requests waiting for a database connection",
            this.pending.clone(),
        );
        this
    }

    /// Copies the pool's idle, in-use and waiting counts into the gauges (at each
    /// scrape).
    pub(crate) fn read(&self, db: &crate::db::Db) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for (state, n) in [("idle", db.idle()), ("in_use", db.in_use())] {
            self.connections
                .get_or_create(&StateLabel { state })
                .set(count(n));
        }
        self.pending.set(count(db.pending()));
    }
}
