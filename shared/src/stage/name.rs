//! The rules for a downstream's name, checked once at start-up.
//!
//! The name becomes a metric label value (`client="inventory"`, `stage="inventory"`),
//! a `Server-Timing` metric name and the `stage` member of problem bodies, so it must be
//! valid in all three and must not be mistaken for another stage.

use super::Stage;

/// The longest downstream name accepted: enough for a service name, short enough for a
/// dashboard legend.
pub(crate) const MAX_NAME_LEN: usize = 32;

/// Why a downstream name was refused; the message names the value and the rule, so it
/// can be shown as it is when start-up fails.
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

/// Checks `name` against the rules of [`Downstream::new`](super::Downstream::new).
pub(super) fn validate(name: &str) -> Result<(), InvalidName> {
    if !well_formed(name.as_bytes()) {
        return Err(InvalidName::Malformed(name.to_owned()));
    }
    if reserved(name.as_bytes()) {
        return Err(InvalidName::Reserved(name.to_owned()));
    }
    Ok(())
}

/// [`validate`] for a `const`: both rules, no message.
pub(super) const fn is_valid(name: &str) -> bool {
    well_formed(name.as_bytes()) && !reserved(name.as_bytes())
}

const fn well_formed(name: &[u8]) -> bool {
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
    true
}

const fn reserved(name: &[u8]) -> bool {
    let mut i = 0;
    while i < Stage::ALL.len() {
        if eq(Stage::ALL[i].as_str().as_bytes(), name) {
            return true;
        }
        i += 1;
    }
    let suffix = b"_pool";
    name.len() >= suffix.len() && eq(name.split_at(name.len() - suffix.len()).1, suffix)
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_checked_against_each_rule() {
        for ok in ["inventory", "payment2", "a", "fraud_check", "catalog"] {
            assert_eq!(validate(ok), Ok(()), "{ok}");
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
                matches!(validate(bad), Err(InvalidName::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(validate(&"a".repeat(MAX_NAME_LEN)).is_ok());
        assert!(validate(&"a".repeat(MAX_NAME_LEN + 1)).is_err());
        for reserved in [
            "ingress",
            "db",
            "db_pool",
            "tool",
            "inventory_pool",
            "catalog_pool",
        ] {
            assert!(
                matches!(validate(reserved), Err(InvalidName::Reserved(_))),
                "{reserved}"
            );
        }
    }

    #[test]
    fn the_message_names_the_value_and_the_rule() {
        let message = validate("Pay-Ment").unwrap_err().to_string();
        assert!(message.contains("\"Pay-Ment\"") && message.contains("lowercase"));
        let message = validate("db").unwrap_err().to_string();
        assert!(message.contains("\"db\"") && message.contains("reserved"));
    }

    proptest! {
        /// Whatever the input, an accepted name gives two stages that are valid label
        /// values, distinct from each other and from every fixed stage.
        #[test]
        fn an_accepted_name_never_collides_with_a_fixed_stage(name in "\\PC{0,40}|[a-z_0-9]{0,40}") {
            if validate(&name).is_ok() {
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
            prop_assume!(a != b && validate(&a).is_ok() && validate(&b).is_ok());
            let (a_pool, b_pool) = (format!("{a}_pool"), format!("{b}_pool"));
            prop_assert_ne!(&a, &b_pool);
            prop_assert_ne!(&b, &a_pool);
            prop_assert_ne!(a_pool, b_pool);
        }
    }
}
