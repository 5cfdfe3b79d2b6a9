//! [`Downstream`]: a service this one calls, and its two stages (`http-client`, `grpc`).

use std::fmt;
use std::sync::Mutex;

use crate::stage::{MAX_NAME_LEN, Stage, is_reserved, is_valid};

/// An outbound downstream: its name (`inventory`, the `client` label of its metrics)
/// and its two stages, `inventory_pool` (waiting for a slot) and `inventory` (the call).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Downstream {
    call: Stage,
    pool: Stage,
}

impl Downstream {
    /// The downstream named `name`, if valid: `[a-z][a-z0-9_]*`, at most 32 characters,
    /// not a fixed stage, not ending in `_pool`. Call it at start-up and fail there: the
    /// names become metric labels. Each distinct name is leaked once.
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        if !is_valid(name) {
            return Err(match is_reserved(name.as_bytes()) {
                true => InvalidName::Reserved(name.to_owned()),
                false => InvalidName::Malformed(name.to_owned()),
            });
        }
        // A panic while holding the lock leaves a valid Vec behind; keep using it.
        let mut known = INTERNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = known.iter().find(|d| d.name() == name) {
            return Ok(*found);
        }
        let call: &'static str = Box::leak(name.to_owned().into_boxed_str());
        let pool: &'static str = Box::leak(format!("{name}_pool").into_boxed_str());
        let downstream = Downstream {
            call: Stage::checked(call),
            pool: Stage::checked(pool),
        };
        known.push(downstream);
        Ok(downstream)
    }

    /// The name: the `client` label of its metrics and the name of its call stage.
    pub const fn name(self) -> &'static str {
        self.call.as_str()
    }

    /// The call stage (`{name}`): connect, send, headers and body.
    pub const fn call(self) -> Stage {
        self.call
    }

    /// The pool stage (`{name}_pool`): waiting for a slot in the client's bulkhead.
    pub const fn pool(self) -> Stage {
        self.pool
    }

    /// Both stages, pool first: what a metrics family pre-registers.
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

/// Why a downstream name was refused; the message names the value and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    /// Empty, too long, or characters outside `[a-z][a-z0-9_]*`.
    #[error(
        "downstream name {0:?} is invalid: use 1 to {MAX_NAME_LEN} characters, a lowercase \
         letter first, then lowercase letters, digits or '_' (like inventory)"
    )]
    Malformed(String),
    /// The name, or its `_pool` stage, is a stage that belongs to something else.
    #[error(
        "downstream name {0:?} is reserved: ingress, db_pool, db and tool are stages of \
         their own, and a name may not end in _pool"
    )]
    Reserved(String),
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
        let count = INTERNED
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.name() == "stage_test_twice")
            .count();
        assert_eq!(count, 1);
    }

    #[test]
    fn stages_serialize_as_their_wire_names() {
        let inventory = Downstream::new("stage_test_serde").unwrap();
        let json = serde_json::to_string(&[Stage::DbPool, inventory.pool()]).unwrap();
        assert_eq!(json, r#"["db_pool","stage_test_serde_pool"]"#);
    }

    use proptest::prelude::*;

    fn validate_name(name: &str) -> Result<(), InvalidName> {
        Downstream::new(name).map(drop)
    }

    #[test]
    fn names_are_checked_against_each_rule() {
        for ok in ["inventory", "payment2", "a", "fraud_check", "catalog"] {
            assert_eq!(validate_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "Inventory",
            "2fa",
            "_x",
            "pay-ment",
            "pay ment",
            "päy",
            "x\n",
        ] {
            assert!(
                matches!(validate_name(bad), Err(InvalidName::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(validate_name(&"a".repeat(MAX_NAME_LEN)).is_ok());
        assert!(validate_name(&"a".repeat(MAX_NAME_LEN + 1)).is_err());
        for reserved in [
            "ingress",
            "db",
            "db_pool",
            "tool",
            "inventory_pool",
            "catalog_pool",
        ] {
            assert!(
                matches!(validate_name(reserved), Err(InvalidName::Reserved(_))),
                "{reserved}"
            );
        }
    }

    #[test]
    fn the_message_names_the_value_and_the_rule() {
        let message = validate_name("Pay-Ment").unwrap_err().to_string();
        assert!(message.contains("\"Pay-Ment\"") && message.contains("lowercase"));
        let message = validate_name("db").unwrap_err().to_string();
        assert!(message.contains("\"db\"") && message.contains("reserved"));
    }

    proptest! {
        /// Whatever the input, an accepted name gives two stages that are valid label
        /// values, distinct from each other and from every fixed stage.
        #[test]
        fn an_accepted_name_never_collides_with_a_fixed_stage(name in "\\PC{0,40}|[a-z_0-9]{0,40}") {
            if validate_name(&name).is_ok() {
                let pool = format!("{name}_pool");
                prop_assert!(name.len() <= MAX_NAME_LEN);
                prop_assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
                prop_assert!(name.as_bytes()[0].is_ascii_lowercase());
                for fixed in Stage::ALL {
                    prop_assert_ne!(fixed.as_str(), name.as_str());
                    prop_assert_ne!(fixed.as_str(), pool.as_str());
                }
                prop_assert!(!name.ends_with("_pool"));
            }
        }

        /// Two different accepted names never share a stage name: neither's call stage
        /// is the other's pool stage.
        #[test]
        fn two_accepted_names_have_disjoint_stages(a in "[a-z][a-z0-9_]{0,12}", b in "[a-z][a-z0-9_]{0,12}") {
            prop_assume!(a != b && validate_name(&a).is_ok() && validate_name(&b).is_ok());
            let (a_pool, b_pool) = (format!("{a}_pool"), format!("{b}_pool"));
            prop_assert_ne!(&a, &b_pool);
            prop_assert_ne!(&b, &a_pool);
            prop_assert_ne!(a_pool, b_pool);
        }
    }
}
