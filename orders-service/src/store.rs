//! [`Store`]: the database as the handlers reach it: the crate's envelope under the
//! request's deadline, or (legacy) the plain pool.

use deadline_propagation::Problem;
use deadline_propagation::db::{Db, DbError, Read, Statements};

use crate::budget::Budget;
use crate::legacy::PlainDb;

/// Both ways to the database, for one request's [`Budget`] to choose from.
#[derive(Clone, Copy, Debug)]
pub struct Store<'a> {
    /// The crate's envelope.
    pub db: &'a Db,
    /// The plain pool of legacy mode.
    pub plain: &'a PlainDb,
}

impl Store<'_> {
    /// Runs `body` in one transaction: under the deadline, or (legacy) on the plain
    /// pool.
    pub async fn transaction<T, B>(&self, budget: &Budget, body: B) -> Result<T, Problem>
    where
        T: Send + 'static,
        B: Statements<T>,
    {
        match budget {
            Budget::Deadline(deadline) => self
                .db
                .transaction(deadline, body)
                .await
                .map_err(unknown_sku_is_404),
            Budget::Unbounded => self.plain.transaction(body).await,
        }
    }

    /// Runs `read` (statements that change nothing): under the deadline, or (legacy)
    /// on the plain pool.
    pub async fn read<T, F>(&self, budget: &Budget, read: F) -> Result<T, Problem>
    where
        T: Send + 'static,
        F: Read<T>,
    {
        match budget {
            Budget::Deadline(deadline) => Ok(self.db.read(deadline, read).await?),
            Budget::Unbounded => self.plain.read(read).await,
        }
    }
}

/// A SKU the catalog knows but the inventory does not (foreign key violation) is the
/// client's mistake, not ours.
fn unknown_sku_is_404(err: DbError) -> Problem {
    match &err {
        DbError::Query(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23503") => {
            Problem::not_found("unknown sku: not in the inventory")
        }
        _ => err.into(),
    }
}
