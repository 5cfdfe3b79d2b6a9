//! The SQL that opens and commits a transaction with its server-side limit: two
//! simple-query batches, each one round trip, made only of utility statements (`SET`
//! needs no snapshot and no plan, so the envelope costs next to nothing; a `SELECT
//! set_config(...)` would cost both). Kept apart from the task that sends them so that
//! a benchmark (`testing::begin_sql`) can time exactly these statements with pgbench.

use std::borrow::Cow;

/// Read-write or read-only: whether the transaction is opened `READ ONLY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `BEGIN`: the default of [`Db::transaction`](super::Db::transaction).
    ReadWrite,
    /// `BEGIN READ ONLY`, as [`Db::read`](super::Db::read) opens it.
    ReadOnly,
}

/// The batch that opens a transaction: `BEGIN`, and the statement limit where the one
/// in force on the session does not serve (`limit_ms`; see `limit.rs`), in one round
/// trip of utility statements. The limit is the session's (no `LOCAL`): in force after
/// COMMIT for the next transaction whose budget is alike, undone by ROLLBACK.
///
/// `statement_timeout` also bounds lock waits (a statement waiting on a lock is still
/// running), so no `lock_timeout` is set beside it. Nothing names the transaction: a
/// cancel finds its backend by the connection (see `backend.rs`).
pub fn begin_sql(access: Access, limit_ms: Option<u64>) -> Cow<'static, str> {
    let begin = match access {
        Access::ReadWrite => "BEGIN",
        Access::ReadOnly => "BEGIN READ ONLY",
    };
    match limit_ms {
        // A simple query takes no bind parameters; the value is an integer.
        Some(limit_ms) => format!("{begin}; SET statement_timeout = {limit_ms}").into(),
        // The usual case: no text to build.
        None => begin.into(),
    }
}

/// The batch that commits. Where the schema can leave work to COMMIT (`deferred`, see
/// `schema.rs`): the limit re-set to what is left, then that work (deferred constraints
/// and constraint triggers) fired as an ordinary statement under the limit, then
/// `COMMIT`. PostgreSQL switches the statement timer off before it commits, so deferred
/// work left to `COMMIT` itself would run unbounded; fired by `SET CONSTRAINTS ALL
/// IMMEDIATE` it is stopped at the deadline and the transaction rolls back. Where the
/// schema has no such work, `COMMIT` alone: the timer would bound nothing in it. This
/// limit is `LOCAL`: it ends with the transaction, and the session's stays in force.
pub fn commit_sql(deferred: bool, limit_ms: u64) -> Cow<'static, str> {
    if deferred {
        format!("SET LOCAL statement_timeout = {limit_ms}; SET CONSTRAINTS ALL IMMEDIATE; COMMIT")
            .into()
    } else {
        "COMMIT".into()
    }
}

/// Runs one of the batches above as a simple query (a text made here is checked SQL)
/// and reads its replies to the end, failing with the first error, as `execute` does.
/// The replies are read from sqlx's stream directly: `execute` wraps that stream in
/// two more boxed layers (a filter and a collect), two allocations and their polls for
/// every `BEGIN` and `COMMIT`, which count on the happy path.
pub(super) async fn run_batch(
    conn: &mut sqlx::PgConnection,
    sql: Cow<'static, str>,
) -> Result<(), sqlx::Error> {
    use futures_util::TryStreamExt as _;
    use sqlx::Executor as _;

    let batch = match sql {
        Cow::Borrowed(sql) => sqlx::raw_sql(sql),
        Cow::Owned(sql) => sqlx::raw_sql(sqlx::AssertSqlSafe(sql)),
    };
    let mut replies = conn.fetch_many(batch);
    while replies.try_next().await?.is_some() {}
    Ok(())
}
