//! [`Job`]: one transaction owning its connection: acquire, `BEGIN` with the limit, the
//! body, then COMMIT as a point of no return or ROLLBACK. It answers as soon as the
//! answer is known, then cleans up: the connection back in the pool in step with the
//! server, or closed when that cannot be made sure of.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::FutureExt as _;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::{Connection as _, Postgres};
use tokio::time::{Instant, timeout, timeout_at};
use tracing::Instrument;

use super::error::exceeded;
use super::handoff::Handoff;
use super::session::{Backend, CANCEL, Change, IN_TRANSACTION, Session, SessionLimit, Sessions};
use super::sql::{Access, begin_sql, commit_sql, run_batch};
use super::{Check, DbError, End, PING_AFTER_IDLE, Statements, classify, proves_rollback};
use crate::deadline::Deadline;
use crate::stage::Stage;

/// How much earlier than the deadline the server is told to stop, so it stops first.
const SERVER_MARGIN: Duration = Duration::from_millis(10);

/// The least budget a step (the first statement, or COMMIT) is started with.
const MIN_STEP: Duration = Duration::from_millis(12);

/// How long past the deadline a COMMIT's outcome is waited for: then it is unknown.
pub(super) const COMMIT_GRACE: Duration = crate::deadline::OUTCOME_GRACE;

/// How long a cancelled statement or a `ROLLBACK` may take before its connection is
/// closed instead of returned.
const CLEANUP_GRACE: Duration = Duration::from_secs(2);

/// How often a cancel is sent again (one between two statements is ignored).
const RECANCEL_EVERY: Duration = Duration::from_millis(25);

/// How long a cancel may take; one that has not answered may land later.
const CANCEL_TIMEOUT: Duration = Duration::from_millis(500);

/// How often a lost COMMIT's backend is looked at until it has left its transaction.
const OUTCOME_POLL: Duration = Duration::from_millis(5);

type Conn = PoolConnection<Postgres>;

/// Everything one transaction needs.
pub(super) struct Job<T> {
    pub(super) pool: PgPool,
    /// Cancels, and learns outcomes, on connections of its own.
    pub(super) side_pool: PgPool,
    pub(super) sessions: Arc<Sessions>,
    pub(super) pending: Arc<AtomicUsize>,
    pub(super) acquire_timeout: Duration,
    pub(super) deadline: Deadline,
    pub(super) access: Access,
    pub(super) deferred: bool,
    pub(super) handoff: Arc<Handoff<T>>,
    /// This transaction's backend, once known: cancels aim at it.
    pub(super) backend: OnceLock<Backend>,
    /// The limit this transaction sent, if the one in force did not serve.
    pub(super) limit_sent: OnceLock<Change>,
    /// A cancel was sent whose outcome is unknown: the connection must not be reused.
    pub(super) cancel_unsettled: AtomicBool,
}

/// How a statement under [`Job::guarded`] ended: finished (`cancelled` if a cancel was
/// sent meanwhile: nothing may be committed), or abandoned (its connection given up).
enum Guarded<O> {
    Finished { output: O, cancelled: bool },
    Abandoned,
}

impl<T: Send> Job<T> {
    /// Runs the transaction and answers through the handoff.
    pub(super) async fn run<B: Statements<T>>(self, body: B) {
        let acquired = self
            .acquire()
            .instrument(self.deadline.stage_span(Stage::DbPool))
            .await;
        let (mut conn, session) = match acquired {
            Ok(taken) => taken,
            Err(err) => return self.answer(Err(err)),
        };
        let connected_at = Instant::now();
        let remaining = self.deadline.remaining_at(connected_at);
        self.deadline.log().observe_start(Stage::Db, remaining);
        let _ = self.handoff.connected_at.set(connected_at);
        let span = self.deadline.stage_span(Stage::Db);
        // Boxed, so each wrapper moves a pointer. A body that panics must not hand its
        // connection back with the transaction open: it is closed here.
        let transacted = Box::pin(self.transact(&mut conn, session, body));
        let ran = AssertUnwindSafe(Instrument::instrument(transacted, span))
            .catch_unwind()
            .await;
        if ran.is_err() {
            tracing::error!("a transaction's body panicked; closing its connection");
            conn.close_on_drop();
        }
        if self.cancel_unsettled.load(Ordering::Relaxed) {
            conn.close_on_drop();
        }
    }

    /// Gives `result` as the answer, unless the caller has answered already or gone.
    fn answer(&self, result: Result<T, DbError>) {
        if self.handoff.claim() {
            self.handoff.give(&self.deadline, result);
        }
    }

    /// Stage `db_pool`: a connection within `min(acquire timeout, remaining)`, with its
    /// session when known already.
    async fn acquire(&self) -> Result<(Conn, Option<Session>), DbError> {
        let deadline = &self.deadline;
        let started = Instant::now();
        let remaining = deadline.remaining_at(started);
        deadline.log().observe_start(Stage::DbPool, remaining);
        if remaining.is_zero() {
            return Err(exceeded(deadline, Stage::DbPool));
        }
        self.pending.fetch_add(1, Ordering::Relaxed);
        let _waited = Waiting(&self.pending);
        let until = deadline.instant().min(started + self.acquire_timeout);
        let acquired = match self.take_idle(started, until).await {
            Some((conn, session)) => Ok(Ok((conn, Some(session)))),
            None => {
                // sqlx's wait holds a whole connect: written into a box made first, so
                // no future moves it.
                let waited = Box::write(Box::new_uninit(), self.pool.acquire());
                let acquired = timeout_at(until, Box::into_pin(waited)).await;
                acquired.map(|acquired| acquired.map(|conn| (conn, None)))
            }
        };
        deadline.log().record(Stage::DbPool, started.elapsed());
        let taken = match acquired {
            Ok(Ok(taken)) => taken,
            Ok(Err(err)) => return Err(classify(err, deadline, Stage::DbPool)),
            Err(_) if deadline.is_expired() => return Err(exceeded(deadline, Stage::DbPool)),
            Err(_) => return Err(classify(sqlx::Error::PoolTimedOut, deadline, Stage::DbPool)),
        };
        // The wait may have used the budget up: then no statement starts at all.
        if deadline.remaining() < MIN_STEP {
            return Err(exceeded(deadline, Stage::DbPool));
        }
        Ok(taken)
    }

    /// A connection the pool holds idle, taken at once without sqlx's wait (a
    /// semaphore and a timer on every order, docs/performance.md); sqlx's check (a ping
    /// after a second idle) is made here. One that fails it is closed.
    async fn take_idle(&self, now: Instant, until: Instant) -> Option<(Conn, Session)> {
        let mut conn = self.pool.try_acquire()?;
        let checked = timeout_at(until, async {
            let session = self.sessions.of(&mut conn).await?;
            if session.renew(now) > PING_AFTER_IDLE {
                conn.ping().await?;
            }
            Ok::<_, sqlx::Error>(session)
        })
        .await;
        match checked {
            Ok(Ok(session)) => Some((conn, session)),
            _ => {
                conn.close_on_drop();
                None
            }
        }
    }

    /// `BEGIN`, the body, then `COMMIT` or `ROLLBACK`; the answer as soon as it is
    /// known, or a 504 `db` when nothing decided one (the caller stopped first).
    async fn transact<B: Statements<T>>(&self, conn: &mut Conn, session: Option<Session>, body: B) {
        if self.handoff.is_stopped() {
            return self.answer(Err(exceeded(&self.deadline, Stage::Db)));
        }
        let begun = match self.identify(conn, session).await {
            Ok(limit) => self.begin(conn, &limit).await,
            Err(err) => Err(err),
        };
        if let Err(err) = begun {
            return self.answer(Err(err));
        }
        let ran = self.guarded(body(conn), CLEANUP_GRACE).await;
        let (output, cancelled) = match ran {
            Guarded::Finished { output, cancelled } => (output, cancelled),
            Guarded::Abandoned => {
                conn.close_on_drop();
                return self.answer(Err(exceeded(&self.deadline, Stage::Db)));
            }
        };
        let (value, check) = match output {
            Ok(End::Commit(value)) => (value, None),
            Ok(End::CommitVerified(value, check)) => (value, Some(check)),
            Ok(End::Rollback(value)) => {
                self.answer(Ok(value));
                return self.rollback(conn).await;
            }
            Err(err) => {
                self.answer(Err(classify(err, &self.deadline, Stage::Db)));
                return self.rollback(conn).await;
            }
        };
        if cancelled || self.handoff.is_stopped() {
            // Too late, or nobody to tell: nothing is written.
            self.answer(Err(exceeded(&self.deadline, Stage::Db)));
            return self.rollback(conn).await;
        }
        self.commit(conn, value, check).await;
    }

    /// The connection's session, so a cancel can reach it. A connection whose session
    /// could not be learned, or whose caller left meanwhile, is closed.
    async fn identify(
        &self,
        conn: &mut Conn,
        known: Option<Session>,
    ) -> Result<Arc<SessionLimit>, DbError> {
        let waited_for = known.is_none();
        let learned = match known {
            Some(session) => Ok(session),
            None => tokio::select! {
                learned = self.sessions.of(conn) => learned,
                () = self.handoff.stopped() => {
                    conn.close_on_drop();
                    return Err(exceeded(&self.deadline, Stage::Db));
                }
            },
        };
        match learned {
            Ok(session) => {
                if waited_for {
                    session.renew(Instant::now());
                }
                let _ = self.backend.set(session.backend);
                Ok(session.limit)
            }
            Err(err) => {
                conn.close_on_drop();
                Err(classify(err, &self.deadline, Stage::Db))
            }
        }
    }

    /// `BEGIN`, with this transaction's limit where the one in force does not serve.
    async fn begin(&self, conn: &mut Conn, limit: &Arc<SessionLimit>) -> Result<(), DbError> {
        let change = limit.plan(server_limit(self.deadline.remaining()));
        let sql = begin_sql(self.access, change.as_ref().map(Change::ms));
        if let Some(change) = change {
            let _ = self.limit_sent.set(change);
        }
        match self.guarded(run_batch(conn, sql), CLEANUP_GRACE).await {
            Guarded::Finished {
                output: Ok(()),
                cancelled: false,
            } => Ok(()),
            Guarded::Finished {
                output: Ok(()),
                cancelled: true,
            } => {
                self.rollback(conn).await;
                Err(exceeded(&self.deadline, Stage::Db))
            }
            Guarded::Finished {
                output: Err(err), ..
            } => {
                self.settle(conn).await;
                Err(classify(err, &self.deadline, Stage::Db))
            }
            Guarded::Abandoned => {
                conn.close_on_drop();
                Err(exceeded(&self.deadline, Stage::Db))
            }
        }
    }

    /// Runs `statement` to its end. If the caller stops first, the statement is
    /// cancelled on the server, again every [`RECANCEL_EVERY`], and read to its end
    /// anyway, so the connection stays in step; `give_up_after` the first cancel, it is
    /// abandoned.
    async fn guarded<F: Future>(
        &self,
        statement: F,
        give_up_after: Duration,
    ) -> Guarded<F::Output> {
        let mut statement = pin!(statement);
        tokio::select! {
            biased;
            output = &mut statement => return Guarded::Finished { output, cancelled: false },
            () = self.handoff.stopped() => {}
        }
        let give_up = Instant::now() + give_up_after;
        // Boxed: rare, and sqlx's futures are large.
        Box::pin(self.cancel_until_ended(statement, give_up)).await
    }

    /// [`guarded`](Self::guarded) past the stop: cancels until the statement ends, or
    /// until `give_up` whatever the network does (no cancel is waited for past it).
    async fn cancel_until_ended<F: Future>(
        &self,
        mut statement: Pin<&mut F>,
        give_up: Instant,
    ) -> Guarded<F::Output> {
        loop {
            // A cancel is awaited even when the statement ends first: none left behind.
            let next = (Instant::now() + RECANCEL_EVERY).min(give_up);
            let cancel = async {
                if timeout_at(give_up, self.cancel_on_server()).await.is_err() {
                    self.cancel_unsettled.store(true, Ordering::Relaxed);
                }
            };
            let (output, ()) = tokio::join!(timeout_at(next, &mut statement), cancel);
            match output {
                Ok(output) => {
                    return Guarded::Finished {
                        output,
                        cancelled: true,
                    };
                }
                Err(_) if Instant::now() >= give_up => {
                    let backend = self.backend.get().map(|b| b.pid);
                    tracing::warn!(
                        backend,
                        "a cancelled statement did not end; closing its connection"
                    );
                    return Guarded::Abandoned;
                }
                Err(_) => {}
            }
        }
    }

    /// Cancels what this transaction's backend runs, from the side pool; a cancel whose
    /// fate is unknown marks the connection for closing (it might land later).
    async fn cancel_on_server(&self) {
        let Some(backend) = self.backend.get() else {
            self.cancel_unsettled.store(true, Ordering::Relaxed);
            return;
        };
        let sent = sqlx::query(CANCEL)
            .bind(backend.pid)
            .bind(backend.started_us)
            .execute(&self.side_pool);
        let failed = match timeout(CANCEL_TIMEOUT, sent).await {
            Ok(Ok(_)) => return,
            Ok(Err(err)) => err.to_string(),
            Err(_) => "it timed out".to_owned(),
        };
        tracing::warn!(
            backend = backend.pid,
            failed,
            "a cancel's fate is unknown; closing the connection"
        );
        self.cancel_unsettled.store(true, Ordering::Relaxed);
    }

    /// COMMIT as a point of no return (see the [module](super)): its outcome awaited
    /// within [`COMMIT_GRACE`], and answered only as the server or the table tells it.
    async fn commit(&self, conn: &mut Conn, value: T, check: Option<Check>) {
        let left = self.deadline.remaining();
        // From here on the outcome is this job's; a caller past its deadline has its 504.
        if left < MIN_STEP || !self.handoff.claim() {
            self.answer(Err(exceeded(&self.deadline, Stage::Db)));
            return self.rollback(conn).await;
        }
        let give = |result| self.handoff.give(&self.deadline, result);
        let sql = commit_sql(self.deferred, server_limit(left));
        let _no_return = self.deadline.point_of_no_return();
        match self.guarded(run_batch(conn, sql), COMMIT_GRACE).await {
            // Committed (past the commit record, PostgreSQL completes it whatever comes).
            Guarded::Finished { output: Ok(()), .. } => {
                if let Some(change) = self.limit_sent.get() {
                    change.committed();
                }
                give(Ok(value));
            }
            Guarded::Finished {
                output: Err(err), ..
            } if proves_rollback(&err) => {
                give(Err(classify(err, &self.deadline, Stage::Db)));
                self.settle(conn).await;
            }
            Guarded::Finished {
                output: Err(err), ..
            } => {
                tracing::warn!(error = %err, "the connection failed during COMMIT");
                conn.close_on_drop();
                let learned = Box::pin(self.learn_outcome(check)).await;
                give(learned.map(|()| value));
            }
            Guarded::Abandoned => {
                tracing::warn!("no outcome for a COMMIT within its grace; closing its connection");
                conn.close_on_drop();
                give(Err(DbError::OutcomeUnknown));
            }
        }
    }

    /// The outcome of a COMMIT whose connection failed, learned on another connection
    /// within the grace: once the backend has left the transaction, `check` reads the
    /// table.
    async fn learn_outcome(&self, check: Option<Check>) -> Result<(), DbError> {
        let (Some(check), Some(backend)) = (check, self.backend.get()) else {
            return Err(DbError::OutcomeUnknown);
        };
        let learned = timeout_at(self.deadline.instant() + COMMIT_GRACE, async {
            let mut side = self.side_pool.acquire().await?;
            loop {
                let running: i64 = sqlx::query_scalar(IN_TRANSACTION)
                    .bind(backend.pid)
                    .bind(backend.started_us)
                    .fetch_one(&mut *side)
                    .await?;
                if running == 0 {
                    break;
                }
                tokio::time::sleep(OUTCOME_POLL).await;
            }
            check.run(&mut side).await
        })
        .await;
        match learned {
            Ok(Ok(true)) => Ok(()),
            // The connection was lost during COMMIT, which did not commit.
            Ok(Ok(false)) => Err(DbError::Unavailable(None)),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "cannot learn the outcome of a COMMIT");
                Err(DbError::OutcomeUnknown)
            }
            Err(_) => Err(DbError::OutcomeUnknown),
        }
    }

    /// `ROLLBACK` of a transaction known to be open; sent again when a cancel that came
    /// just as its statement ended hits it (57014).
    async fn rollback(&self, conn: &mut Conn) {
        for _attempt in 0..2 {
            let sent = timeout(
                CLEANUP_GRACE,
                sqlx::raw_sql("ROLLBACK").execute(&mut **conn),
            );
            match sent.await {
                Ok(Ok(_)) => {
                    if let Some(change) = self.limit_sent.get() {
                        change.rolled_back();
                    }
                    return;
                }
                Ok(Err(sqlx::Error::Database(err))) if err.code().as_deref() == Some("57014") => {}
                _ => break,
            }
        }
        conn.close_on_drop();
    }

    /// After an error whose place is unknown: `SELECT 1` fails only in an aborted
    /// transaction (25P02), which a `ROLLBACK` then ends.
    async fn settle(&self, conn: &mut Conn) {
        let probe = timeout(
            CLEANUP_GRACE,
            sqlx::raw_sql("SELECT 1").execute(&mut **conn),
        );
        match probe.await {
            Ok(Ok(_)) => {}
            Ok(Err(sqlx::Error::Database(err))) if err.code().as_deref() == Some("25P02") => {
                self.rollback(conn).await;
            }
            _ => conn.close_on_drop(),
        }
    }
}

/// The largest `statement_timeout` PostgreSQL takes (`INT_MAX` ms, about 24.8 days): a
/// larger value makes the `SET` fail, and with it the transaction.
const MAX_SERVER_LIMIT_MS: u64 = i32::MAX as u64;

/// The server-side limit for a step with `left`: a little less, so the server stops
/// first, at least 1 ms (0 would mean none), and at most what the server takes.
fn server_limit(left: Duration) -> u64 {
    let ms = left
        .saturating_sub(SERVER_MARGIN)
        .max(Duration::from_millis(1));
    u64::try_from(ms.as_millis()).map_or(MAX_SERVER_LIMIT_MS, |ms| ms.min(MAX_SERVER_LIMIT_MS))
}

/// A request waiting for a connection, counted until this is dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_limit_is_never_more_than_postgres_takes() {
        assert_eq!(server_limit(Duration::MAX), MAX_SERVER_LIMIT_MS);
        assert_eq!(
            server_limit(Duration::from_secs(30 * 24 * 3600)),
            MAX_SERVER_LIMIT_MS
        );
        assert_eq!(server_limit(Duration::from_millis(510)), 500);
        assert_eq!(server_limit(Duration::ZERO), 1);
    }
}
