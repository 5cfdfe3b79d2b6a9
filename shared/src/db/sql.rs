//! The SQL that opens and commits a transaction with its server-side limits: two
//! simple-query batches, each one round trip. Kept apart from the task that sends them
//! so that `cargo xtask cost` can measure exactly these statements with pgbench.

/// Read-write or read-only: whether the transaction is opened `READ ONLY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `BEGIN`: the default of [`Db::transaction`](super::Db::transaction).
    ReadWrite,
    /// `BEGIN READ ONLY`, as [`Db::read`](super::Db::read) opens it.
    ReadOnly,
}

/// The batch that opens a transaction: `BEGIN`, the backend's PID (what a cancel names)
/// and both limits, in one round trip. Public so that `cargo xtask cost` measures the
/// very SQL the service sends.
///
/// ```
/// use shared::db::{Access, begin_sql};
/// assert!(begin_sql(Access::ReadOnly, 640).starts_with("BEGIN READ ONLY; SELECT pg_backend_pid()"));
/// ```
pub fn begin_sql(access: Access, limit_ms: u128) -> String {
    let mode = match access {
        Access::ReadWrite => "",
        Access::ReadOnly => " READ ONLY",
    };
    // A simple query takes no bind parameters; the values are integers we format.
    format!(
        "BEGIN{mode}; SELECT pg_backend_pid(), \
         set_config('statement_timeout', '{limit_ms}', true), \
         set_config('lock_timeout', '{limit_ms}', true)"
    )
}

/// The batch that commits with the limits re-set to what is left (deferred work stops
/// at the deadline). Public for the same reason as [`begin_sql`].
///
/// ```
/// assert!(shared::db::commit_sql(90).ends_with("; COMMIT"));
/// ```
pub fn commit_sql(limit_ms: u128) -> String {
    format!(
        "SELECT set_config('statement_timeout', '{limit_ms}', true), \
         set_config('lock_timeout', '{limit_ms}', true); COMMIT"
    )
}
