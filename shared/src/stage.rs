//! The named steps a request's budget is spent on.
//!
//! Every 504 and 503 names the stage where the budget ran out, and the metrics are
//! labelled with it, so an operator can tell "waiting for a pooled connection" apart from
//! "the downstream itself is slow". The contract's names (docs/design.md §3.5) are
//! constants here; each outbound HTTP downstream adds two more, named by configuration
//! ([`Downstream`]): `inventory_pool` and `inventory` for a client named `inventory`.
//!
//! # Why a name and not an enum
//!
//! A closed enum made every second downstream report as `catalog`: its 504s, 503s,
//! metrics and `Server-Timing` all blamed the wrong service. A [`Stage`] is its wire
//! name, a `&'static str`, so it stays `Copy` and can label metrics without allocating.
//! The names of a downstream come from runtime configuration and are leaked once per
//! distinct name ([`Downstream::new`] interns them): clients are built once at start-up,
//! so the set of stage names (and of metric label values) is bounded by configuration,
//! never by requests. No request can create a stage.

use std::fmt;
use std::sync::Mutex;

mod name;

pub use name::{DownstreamNameError, MAX_NAME_LEN};

/// One step of a request that runs under the request's [`Deadline`](crate::Deadline).
///
/// The fixed stages are associated constants spelled like the enum variants they used
/// to be (`Stage::Catalog`), so code and `match` patterns written against the enum keep
/// compiling. A downstream's stages come from [`Downstream`].
///
/// ```
/// use shared::Stage;
///
/// assert_eq!(Stage::DbPool.as_str(), "db_pool");
/// assert_eq!(Stage::Catalog.to_string(), "catalog");
/// match Stage::Db {
///     Stage::Db => {}
///     other => panic!("unexpected {other}"),
/// }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stage(&'static str);

#[allow(non_upper_case_globals)] // the spelling of the former enum variants, kept on purpose
impl Stage {
    /// The handler as a whole, bounded by the ingress layer.
    pub const Ingress: Stage = Stage("ingress");
    /// Waiting for a slot in the catalog client's bulkhead (its pool queue).
    pub const CatalogPool: Stage = Stage("catalog_pool");
    /// The catalog call itself: connect, send, headers and body.
    pub const Catalog: Stage = Stage("catalog");
    /// Waiting for a PostgreSQL connection from the pool.
    pub const DbPool: Stage = Stage("db_pool");
    /// SQL statements, cancelled by the server at the deadline.
    pub const Db: Stage = Stage("db");
    /// One tool call of an AI assistant turn.
    pub const Tool: Stage = Stage("tool");
}

impl Stage {
    /// The contract's stages, in the order a request meets them. Their metric series
    /// exist from start-up in every service; a configured downstream adds its own two
    /// when its client is built.
    ///
    /// ```
    /// assert!(shared::Stage::ALL.contains(&shared::Stage::CatalogPool));
    /// ```
    pub const ALL: [Stage; 6] = [
        Stage::Ingress,
        Stage::CatalogPool,
        Stage::Catalog,
        Stage::DbPool,
        Stage::Db,
        Stage::Tool,
    ];

    /// The stages that belong to no downstream; a downstream may not take their names.
    ///
    /// ```
    /// use shared::{Stage, stage::Downstream};
    ///
    /// for fixed in Stage::FIXED {
    ///     assert!(Downstream::new(fixed.as_str()).is_err(), "{fixed}");
    /// }
    /// ```
    pub const FIXED: [Stage; 4] = [Stage::Ingress, Stage::DbPool, Stage::Db, Stage::Tool];

    /// The wire name used in problem bodies, metric labels and `Server-Timing`.
    ///
    /// ```
    /// assert_eq!(shared::Stage::Tool.as_str(), "tool");
    /// ```
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    /// The stage with wire name `name`: one of [`Stage::ALL`] or a stage of a downstream
    /// built in this process; `None` for any other name. Nothing is allocated, so text
    /// from outside (a problem body being read) can never add a stage.
    ///
    /// ```
    /// use shared::{Stage, stage::Downstream};
    ///
    /// assert_eq!(Stage::lookup("db"), Some(Stage::Db));
    /// let payment = Downstream::new("payment").unwrap();
    /// assert_eq!(Stage::lookup("payment_pool"), Some(payment.pool()));
    /// assert_eq!(Stage::lookup("never_configured"), None);
    /// ```
    pub fn lookup(name: &str) -> Option<Stage> {
        if let Some(stage) = Stage::ALL.into_iter().find(|s| s.0 == name) {
            return Some(stage);
        }
        interned()
            .iter()
            .flat_map(|d| [d.call, d.pool])
            .find(|s| s.0 == name)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Serialized as its wire name (`"catalog_pool"`), as in problem bodies.
impl serde::Serialize for Stage {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

/// Reads a wire name through [`Stage::lookup`]: a name that is neither in the contract
/// nor configured in this process is an error, never a new (leaked) stage.
impl<'de> serde::Deserialize<'de> for Stage {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Stage::lookup(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown stage {name:?}")))
    }
}

/// An outbound HTTP downstream as the stages see it: its name (`inventory`, the
/// `client` label of its metrics) and its two stages, `{name}_pool` (waiting for a slot
/// in its bulkhead) and `{name}` (the call itself).
///
/// Build one per configured downstream at start-up, with [`Downstream::new`]; a
/// [`ClientConfig`](crate::client::ClientConfig) carries it, so a client's 504s, 503s,
/// metrics and `Server-Timing` name the service that was slow.
///
/// ```
/// use shared::stage::Downstream;
///
/// let inventory = Downstream::new("inventory").expect("a valid name");
/// assert_eq!(inventory.name(), "inventory");
/// assert_eq!(inventory.call().as_str(), "inventory");
/// assert_eq!(inventory.pool().as_str(), "inventory_pool");
/// assert!(Downstream::new("db").is_err(), "db is a fixed stage");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Downstream {
    call: Stage,
    pool: Stage,
}

impl Downstream {
    /// The catalog, as orders-service configures it: stages `catalog` and
    /// `catalog_pool` of the contract.
    pub const CATALOG: Downstream = Downstream {
        call: Stage::Catalog,
        pool: Stage::CatalogPool,
    };

    /// The downstream named `name`, if the name is valid: `[a-z][a-z0-9_]*`, at most
    /// [`MAX_NAME_LEN`] characters, not ending in `_pool` (that would collide with
    /// another downstream's pool stage), and not a [fixed stage](Stage::FIXED)
    /// (`ingress`, `db_pool`, `db`, `tool`). Call it at start-up and fail there with the
    /// error's message: the names become metric labels and must be valid for Prometheus
    /// and unambiguous in a problem body.
    ///
    /// The names are leaked, once per distinct name however often this is called, so a
    /// process holds at most as many as its configuration names.
    ///
    /// ```
    /// use shared::stage::Downstream;
    ///
    /// assert_eq!(Downstream::new("catalog").unwrap(), Downstream::CATALOG);
    /// let err = Downstream::new("Payment").unwrap_err();
    /// assert!(err.to_string().contains("Payment"), "{err}");
    /// ```
    pub fn new(name: &str) -> Result<Self, DownstreamNameError> {
        name::validate(name)?;
        if name == Downstream::CATALOG.name() {
            return Ok(Downstream::CATALOG);
        }
        let mut known = interned();
        if let Some(found) = known.iter().find(|d| d.name() == name) {
            return Ok(*found);
        }
        let call: &'static str = Box::leak(name.to_owned().into_boxed_str());
        let pool: &'static str = Box::leak(format!("{name}_pool").into_boxed_str());
        let downstream = Downstream {
            call: Stage(call),
            pool: Stage(pool),
        };
        known.push(downstream);
        Ok(downstream)
    }

    /// The name: the `client` label of its metrics and the name of its call stage.
    ///
    /// ```
    /// assert_eq!(shared::stage::Downstream::CATALOG.name(), "catalog");
    /// ```
    pub const fn name(self) -> &'static str {
        self.call.0
    }

    /// The call stage (`{name}`): connect, send, headers and body.
    ///
    /// ```
    /// use shared::{Stage, stage::Downstream};
    /// assert_eq!(Downstream::CATALOG.call(), Stage::Catalog);
    /// ```
    pub const fn call(self) -> Stage {
        self.call
    }

    /// The pool stage (`{name}_pool`): waiting for a slot in the client's bulkhead.
    ///
    /// ```
    /// use shared::{Stage, stage::Downstream};
    /// assert_eq!(Downstream::CATALOG.pool(), Stage::CatalogPool);
    /// ```
    pub const fn pool(self) -> Stage {
        self.pool
    }

    /// Both stages, pool first (the order a call meets them): what a metrics family
    /// pre-registers for this downstream.
    ///
    /// ```
    /// use shared::{Stage, stage::Downstream};
    /// assert_eq!(Downstream::CATALOG.stages(), [Stage::CatalogPool, Stage::Catalog]);
    /// ```
    pub const fn stages(self) -> [Stage; 2] {
        [self.pool, self.call]
    }
}

impl fmt::Display for Downstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every downstream built in this process except the catalog (which is constant).
static INTERNED: Mutex<Vec<Downstream>> = Mutex::new(Vec::new());

fn interned() -> std::sync::MutexGuard<'static, Vec<Downstream>> {
    // A panic while holding the lock leaves a valid Vec behind; keep using it.
    INTERNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_names_are_unchanged() {
        let names = Stage::ALL.map(Stage::as_str);
        assert_eq!(
            names,
            [
                "ingress",
                "catalog_pool",
                "catalog",
                "db_pool",
                "db",
                "tool"
            ]
        );
    }

    #[test]
    fn building_a_downstream_twice_gives_the_same_names_without_leaking_again() {
        let first = Downstream::new("stage_test_twice").unwrap();
        let second = Downstream::new("stage_test_twice").unwrap();
        assert_eq!(first, second);
        assert!(std::ptr::eq(first.name(), second.name()));
        let count = interned()
            .iter()
            .filter(|d| d.name() == "stage_test_twice")
            .count();
        assert_eq!(count, 1);
    }

    #[test]
    fn stages_serialize_as_their_wire_names_and_read_back_only_when_known() {
        let inventory = Downstream::new("stage_test_serde").unwrap();
        let json = serde_json::to_string(&[Stage::CatalogPool, inventory.pool()]).unwrap();
        assert_eq!(json, r#"["catalog_pool","stage_test_serde_pool"]"#);
        let back: Vec<Stage> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [Stage::CatalogPool, inventory.pool()]);
        assert!(serde_json::from_str::<Stage>(r#""made_up_by_a_client""#).is_err());
    }
}
