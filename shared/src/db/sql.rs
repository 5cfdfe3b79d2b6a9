//! The SQL that opens and commits a transaction with its server-side limit: two
//! simple-query batches, each one round trip, made only of utility statements (`SET`
//! needs no snapshot and no plan, so the envelope costs next to nothing; a `SELECT
//! set_config(...)` would cost both). Kept apart from the task that sends them so that
//! a benchmark (`testing::begin_sql`) can time exactly these statements with pgbench.

/// Read-write or read-only: whether the transaction is opened `READ ONLY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `BEGIN`: the default of [`Db::transaction`](super::Db::transaction).
    ReadWrite,
    /// `BEGIN READ ONLY`, as [`Db::read`](super::Db::read) opens it.
    ReadOnly,
}

/// The batch that opens a transaction: `BEGIN`, the statement limit, and the marker
/// that names this transaction in `pg_stat_activity` (a cancel finds the backend by it,
/// and cannot reach a later transaction of the same connection: `SET LOCAL` ends with
/// the transaction).
///
/// `statement_timeout` also bounds lock waits (a statement waiting on a lock is still
/// running), so no `lock_timeout` is set beside it. `marker` must be a plain word (it is
/// formatted into the SQL); [`Db`](super::Db) makes it from letters, digits and `-`.
pub fn begin_sql(access: Access, limit_ms: u128, marker: &str) -> String {
    let mode = match access {
        Access::ReadWrite => "",
        Access::ReadOnly => " READ ONLY",
    };
    // A simple query takes no bind parameters; the values are an integer and a word we make.
    format!(
        "BEGIN{mode}; SET LOCAL statement_timeout = {limit_ms}; \
         SET LOCAL application_name = '{marker}'"
    )
}

/// The batch that commits: the limit re-set to what is left, then the deferred work
/// (deferred constraints and constraint triggers) fired as an ordinary statement under
/// that limit, then `COMMIT`. PostgreSQL switches the statement timer off before it
/// commits, so deferred work left to `COMMIT` itself would run unbounded; fired by
/// `SET CONSTRAINTS ALL IMMEDIATE` it is stopped at the deadline and the transaction
/// rolls back.
pub fn commit_sql(limit_ms: u128) -> String {
    format!("SET LOCAL statement_timeout = {limit_ms}; SET CONSTRAINTS ALL IMMEDIATE; COMMIT")
}
