//! The named steps a request's budget is spent on. Every 504 and 503 names the stage
//! where the budget ran out, and the metrics are labelled with it, so "waiting for a
//! pooled connection" is told apart from "the downstream is slow". A [`Stage`] is its
//! wire name, a `&'static str`; a [`Downstream`]'s two are leaked once per name at
//! start-up, so the stages (and label values) are bounded by configuration, never by
//! requests.

use std::fmt;

/// One step of a request that runs under the request's [`Deadline`](crate::Deadline).
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
    /// The fixed stages, whose series exist from start-up.
    #[cfg(any(test, feature = "metrics"))]
    pub(crate) const ALL: [Stage; 4] = [Stage::Ingress, Stage::DbPool, Stage::Db, Stage::Tool];

    /// A step of your own (a cache, a file read). Use it in a `const`
    /// (`const CACHE: Stage = Stage::named("cache");`): a bad name fails the build.
    pub const fn named(name: &'static str) -> Stage {
        assert!(
            is_valid(name),
            "a stage name is [a-z][a-z0-9_]*, at most 32 bytes, not reserved"
        );
        Stage(name)
    }

    /// A stage of a name [`is_valid`] accepted at run time, leaked once.
    #[cfg(any(feature = "http-client", feature = "grpc"))]
    pub(crate) const fn checked(name: &'static str) -> Stage {
        Stage(name)
    }

    /// The wire name used in problem bodies, metric labels and `Server-Timing`.
    pub const fn as_str(self) -> &'static str {
        self.0
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

/// The longest downstream name.
pub(crate) const MAX_NAME_LEN: usize = 32;

/// The rules of [`Downstream::new`], in a `const`: `[a-z][a-z0-9_]*`, at most
/// [`MAX_NAME_LEN`], not a fixed stage, not ending in `_pool`.
pub(crate) const fn is_valid(name: &str) -> bool {
    let name = name.as_bytes();
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name[0].is_ascii_lowercase() {
        return false;
    }
    let mut i = 1;
    while i < name.len() {
        let b = name[i];
        if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
            return false;
        }
        i += 1;
    }
    !is_reserved(name)
}

/// A fixed stage's name, or another downstream's pool stage.
pub(crate) const fn is_reserved(name: &[u8]) -> bool {
    matches!(
        name,
        b"ingress" | b"db_pool" | b"db" | b"tool" | [.., b'_', b'p', b'o', b'o', b'l']
    )
}
