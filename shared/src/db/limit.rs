//! [`SessionLimit`]: the `statement_timeout` in force on one pooled session, so that a
//! transaction sends a limit only when the one in force does not serve its budget.
//!
//! # Why not `SET LOCAL` in every transaction
//!
//! A limit set with `SET LOCAL` ends with its transaction, so every transaction paid
//! for one: measured with callgrind, about 21,000 of PostgreSQL's 820,000 instructions
//! per order transaction (parsing the statement, the utility portal, the settings
//! stack, and at the end of the transaction a walk over every setting), and 4 to 6 % of
//! pgbench's throughput in runs here (docs/experiment.md#the-cost-of-the-technique). A
//! limit set for the session stays in force after COMMIT, so the next transaction on
//! that session, whose budget is alike (most requests carry the same budget, or the
//! ingress default), sends none.
//!
//! # What a limit in force promises
//!
//! A transaction wants `wanted` ms for its first statement (what is left, less a
//! margin). The limit in force serves it when it is *never later*, so the server stops
//! the statement no later than the exact limit would, and *at most a sixteenth
//! earlier* (`wanted - wanted / 16 ..= wanted`): a budget spent a little early on the
//! server, never overspent. A limit that is sent is set a thirty-second early, the
//! middle of that window, so transactions whose budgets differ by up to about ±3 % all
//! reuse it.
//!
//! # Why it is tracked per connection, and is only ever wrong safely
//!
//! A `SET` inside a transaction is undone when the transaction rolls back, and cannot
//! be moved out of it: a `SET` before `BEGIN` in the same query joins the transaction.
//! So the value in force is known only once the transaction's end is: unknown from the
//! moment a `SET` is sent, the new value after a COMMIT, the old one after a ROLLBACK.
//! Any other end (a lost connection, an abandoned statement) leaves it unknown, and the
//! next transaction on that session sends its limit again; an unknown limit never
//! serves.
//!
//! The mode switches at run time and a connection serves transactions of every mode:
//! an observed transaction runs as code without the technique, with the server's own
//! `statement_timeout`, so a session whose limit is not known to be the server's own is
//! reset first (`SET statement_timeout = DEFAULT`, once, outside any transaction).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server's own value: a session reset by an observed transaction.
const SERVER_DEFAULT: u64 = 0;
/// A `SET` was sent whose transaction has not been seen to end.
const UNKNOWN: u64 = u64::MAX;

/// The `statement_timeout` in force on one session, as far as its pool knows: the
/// server's own, a known number of ms, or unknown.
#[derive(Debug)]
pub(super) struct SessionLimit(AtomicU64);

impl SessionLimit {
    /// A session just learned: a new one, or one whose entry was lost while a limit
    /// may be in force, which cannot be told apart; an observed transaction resets it
    /// once, a propagate one sends its own.
    pub(super) fn unknown() -> Self {
        Self(AtomicU64::new(UNKNOWN))
    }

    /// What a transaction that wants `wanted_ms` for its first statement must send:
    /// nothing when the limit in force serves it, else a [`Change`] (the limit to set,
    /// which this session's value stays unknown under until the transaction ends).
    pub(super) fn plan(self: &Arc<Self>, wanted_ms: u64) -> Option<Change> {
        let prior = self.0.load(Ordering::Acquire);
        if serves(prior, wanted_ms) {
            return None;
        }
        self.0.store(UNKNOWN, Ordering::Release);
        Some(Change {
            slot: Arc::clone(self),
            prior,
            set: to_set(wanted_ms),
        })
    }

    /// Whether an observed transaction must first reset the session to the server's own
    /// value (a limit the technique set, or one it may have set).
    pub(super) fn needs_reset(&self) -> bool {
        self.0.load(Ordering::Acquire) != SERVER_DEFAULT
    }

    /// The session was reset to the server's own value.
    pub(super) fn was_reset(&self) {
        self.0.store(SERVER_DEFAULT, Ordering::Release);
    }
}

/// A limit sent inside a transaction: in force after COMMIT, undone by ROLLBACK.
#[derive(Debug)]
pub(super) struct Change {
    slot: Arc<SessionLimit>,
    prior: u64,
    set: u64,
}

impl Change {
    /// The limit to send, ms (at least 1: 0 would mean none).
    pub(super) fn ms(&self) -> u64 {
        self.set
    }

    /// The transaction committed: its limit is in force on the session.
    pub(super) fn committed(&self) {
        self.slot.0.store(self.set, Ordering::Release);
    }

    /// The transaction rolled back: the limit in force before it is again.
    pub(super) fn rolled_back(&self) {
        self.slot.0.store(self.prior, Ordering::Release);
    }
}

/// Whether the limit `in_force` serves a statement that may run `wanted` ms: never
/// later, at most a sixteenth earlier; the server's own value and an unknown one never.
fn serves(in_force: u64, wanted: u64) -> bool {
    in_force != SERVER_DEFAULT
        && in_force != UNKNOWN
        && in_force <= wanted
        && in_force >= wanted - wanted / 16
}

/// The limit sent for `wanted` ms: the middle of the window that serves it, so that
/// budgets a little longer or shorter reuse it; at least 1 ms.
fn to_set(wanted: u64) -> u64 {
    (wanted - wanted / 32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_new_session_sends_its_limit_and_the_next_alike_budget_sends_none() {
        let session = Arc::new(SessionLimit::unknown());
        let change = session.plan(690).expect("a new session's limit is unknown");
        assert_eq!(change.ms(), 690 - 690 / 32);
        change.committed();
        assert!(session.plan(690).is_none());
        assert!(session.plan(680).is_none(), "3 % shorter still served");
        assert!(session.plan(700).is_none(), "3 % longer still served");
    }

    #[test]
    fn a_shorter_budget_than_the_limit_in_force_sends_its_own() {
        let session = Arc::new(SessionLimit::unknown());
        session.plan(690).unwrap().committed();
        let change = session.plan(300).expect("the limit in force is later");
        assert_eq!(change.ms(), 300 - 300 / 32);
    }

    #[test]
    fn a_much_longer_budget_sends_its_own() {
        let session = Arc::new(SessionLimit::unknown());
        session.plan(300).unwrap().committed();
        assert!(session.plan(2000).is_some(), "would stop far too early");
    }

    #[test]
    fn a_rolled_back_transaction_leaves_the_limit_before_it() {
        let session = Arc::new(SessionLimit::unknown());
        session.plan(690).unwrap().committed();
        session.plan(100).unwrap().rolled_back();
        assert!(session.plan(690).is_none(), "690's limit is in force again");
        let change = session.plan(100).unwrap();
        drop(change); // neither committed nor rolled back: unknown
        assert!(session.plan(690).is_some(), "an unknown limit never serves");
        assert!(session.needs_reset());
    }

    #[test]
    fn observe_resets_a_session_unless_it_has_the_servers_own() {
        let session = Arc::new(SessionLimit::unknown());
        assert!(
            session.needs_reset(),
            "a session just learned may carry a limit"
        );
        session.was_reset();
        assert!(!session.needs_reset());
        session.plan(690).unwrap().rolled_back();
        assert!(!session.needs_reset(), "rolled back to the server's own");
        session.plan(690).unwrap().committed();
        assert!(session.needs_reset());
        session.was_reset();
        assert!(!session.needs_reset());
        assert!(session.plan(690).is_some(), "the server's own never serves");
    }

    proptest! {
        /// Whatever came before on the session, the limit in force after planning is
        /// never later than wanted and at most a sixteenth earlier.
        #[test]
        fn the_limit_in_force_is_never_later_and_at_most_a_sixteenth_early(
            history in proptest::collection::vec((1u64..100_000, any::<bool>()), 0..8),
            wanted in 1u64..100_000,
        ) {
            let session = Arc::new(SessionLimit::unknown());
            for (earlier, commit) in history {
                if let Some(change) = session.plan(earlier) {
                    if commit { change.committed() } else { change.rolled_back() }
                }
            }
            let in_force = session.0.load(Ordering::Acquire);
            let limit = match session.plan(wanted) {
                Some(change) => change.ms(),
                None => in_force,
            };
            prop_assert!(limit >= 1 && limit <= wanted, "{limit} for {wanted}");
            prop_assert!(limit >= wanted - wanted / 16, "{limit} for {wanted}");
        }
    }
}
