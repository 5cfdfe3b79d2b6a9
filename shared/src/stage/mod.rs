//! The named steps a request's budget is spent on.
//!
//! Every 504 and 503 names the stage where the budget ran out, and the metrics are
//! labelled with it, so an operator can tell "waiting for a pooled connection" apart from
//! "the downstream itself is slow". The fixed names are
//! constants here; each outbound HTTP downstream adds two more, named by configuration
//! ([`Downstream`]): `inventory_pool` and `inventory` for a client named `inventory`.
//!
//! A [`Stage`] is its wire name, a `&'static str`: `Copy`, and a metric label without
//! an allocation. A downstream's names come from configuration and are leaked once per
//! distinct name ([`Downstream::new`] interns them): clients are built at start-up, so
//! the set of stage names (and of metric label values) is bounded by configuration,
//! never by requests. No request can create a stage.

use std::fmt;
use std::sync::Mutex;

mod name;

pub use name::InvalidName;

/// One step of a request that runs under the request's [`Deadline`](crate::Deadline).
///
/// The library's own stages are associated constants, spelled as enum variants so a
/// `match` reads like one; a downstream's two stages come from [`Downstream`], and a
/// step of your own is [`Stage::named`].
///
/// ```
/// use deadline_propagation::Stage;
///
/// const PRICING: Stage = Stage::named("pricing");
/// assert_eq!(PRICING.to_string(), "pricing");
/// assert_eq!(Stage::DbPool.as_str(), "db_pool");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stage(&'static str);

#[allow(non_upper_case_globals)] // read as enum variants in `match`
impl Stage {
    /// The handler as a whole, bounded by the ingress layer.
    pub const Ingress: Stage = Stage("ingress");
    /// Waiting for a PostgreSQL connection from the pool.
    pub const DbPool: Stage = Stage("db_pool");
    /// SQL statements, cancelled by the server at the deadline.
    pub const Db: Stage = Stage("db");
    /// One tool call of an AI assistant turn.
    pub const Tool: Stage = Stage("tool");
}

impl Stage {
    /// The library's own stages, in the order a request meets them. Their metric series
    /// exist from start-up; a downstream adds its own two when it is declared. A
    /// downstream or a [named](Stage::named) step may not take these names.
    pub(crate) const ALL: [Stage; 4] = [Stage::Ingress, Stage::DbPool, Stage::Db, Stage::Tool];

    /// A step of your own (a call to a cache, a file read) run with
    /// [`Deadline::run`](crate::Deadline::run): its 504 and `Server-Timing` entry carry
    /// this name. Use it in a `const`, so a bad name fails the build: the name follows
    /// a downstream's rules ([`Downstream::new`]).
    ///
    /// # Panics
    ///
    /// On a name that a downstream could not take (in a `const`, at compile time).
    pub const fn named(name: &'static str) -> Stage {
        assert!(
            name::is_valid(name),
            "a stage name is [a-z][a-z0-9_]*, at most 32 bytes, not reserved"
        );
        Stage(name)
    }

    /// The wire name used in problem bodies, metric labels and `Server-Timing`.
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    /// The stage with wire name `name`: one of the library's stages or a stage of a
    /// downstream declared in this process; `None` for any other name. Nothing is
    /// allocated, so text from outside (a problem body being read) never adds a stage.
    pub(crate) fn lookup(name: &str) -> Option<Stage> {
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

/// Reads a wire name through `Stage::lookup`: a name that is neither in the contract
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
/// use deadline_propagation::Downstream;
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
    /// The downstream named `name`, if the name is valid: `[a-z][a-z0-9_]*`, at most
    /// 32 characters, not ending in `_pool` (that would collide with
    /// another downstream's pool stage), and not one of the library's stages (`ingress`,
    /// `db_pool`, `db`, `tool`). Call it at start-up and fail there with the
    /// error's message: the names become metric labels and must be valid for Prometheus
    /// and unambiguous in a problem body.
    ///
    /// The names are leaked, once per distinct name however often this is called, so a
    /// process holds at most as many as its configuration names.
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        name::validate(name)?;
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
    pub const fn name(self) -> &'static str {
        self.call.0
    }

    /// The call stage (`{name}`): connect, send, headers and body.
    pub const fn call(self) -> Stage {
        self.call
    }

    /// The pool stage (`{name}_pool`): waiting for a slot in the client's bulkhead.
    pub const fn pool(self) -> Stage {
        self.pool
    }

    /// Both stages, pool first (the order a call meets them): what a metrics family
    /// pre-registers for this downstream.
    pub const fn stages(self) -> [Stage; 2] {
        [self.pool, self.call]
    }
}

impl fmt::Display for Downstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every downstream declared in this process.
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
        assert_eq!(names, ["ingress", "db_pool", "db", "tool"]);
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
        let json = serde_json::to_string(&[Stage::DbPool, inventory.pool()]).unwrap();
        assert_eq!(json, r#"["db_pool","stage_test_serde_pool"]"#);
        let back: Vec<Stage> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [Stage::DbPool, inventory.pool()]);
        assert!(serde_json::from_str::<Stage>(r#""made_up_by_a_client""#).is_err());
    }
}
