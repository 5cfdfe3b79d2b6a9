//! [`Job`]: one transaction on a task that owns its connection (see the module docs of
//! [`db`](super) for why).
//!
//! The job answers its caller through a oneshot channel as soon as the answer is known
//! (a 504 at the deadline does not wait for the server to confirm the cancel), then
//! finishes its cleanup: the cancelled statement's error read, `ROLLBACK` sent, the
//! connection back in the pool in step with the server.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row};
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::sql::{Access, begin_sql, commit_sql};
use super::{Body, DbError, End, classify};
use crate::deadline::Deadline;
use crate::metrics::DbMetrics;
use crate::stage::Stage;

/// How much earlier than the deadline the server is told to give up. `lock_timeout` and
/// `statement_timeout` count from the start of each statement, which comes a round trip
/// after they are set; the margin covers that, so the server usually stops first and
/// the client-side cancel at the deadline is the exception.
const SERVER_MARGIN: Duration = Duration::from_millis(10);

/// The least budget for which a step (the first statement, or COMMIT) is started: less
/// than this leaves the server no time of its own, so the step is refused without I/O.
const MIN_STEP: Duration = Duration::from_millis(12);

/// How long past the deadline the job waits to learn the outcome of a COMMIT it sent.
/// The COMMIT carries `statement_timeout` = what was left, so the server normally
/// answers before the deadline; this covers a slow WAL flush or network. Shorter than
/// [`NO_RETURN_GRACE`](crate::deadline::NO_RETURN_GRACE), the ingress layer's backstop.
///
/// ```
/// use shared::{db::COMMIT_GRACE, deadline::NO_RETURN_GRACE};
///
/// assert!(COMMIT_GRACE < NO_RETURN_GRACE);
/// ```
pub const COMMIT_GRACE: Duration = Duration::from_millis(250);

/// How long a cancelled statement (or a `ROLLBACK`) may take to come back before the
/// connection is given up and closed instead of returned.
const CLEANUP_GRACE: Duration = Duration::from_secs(2);

/// Everything one transaction needs, moved onto its task.
pub(super) struct Job {
    pub(super) pool: PgPool,
    pub(super) cancel_pool: PgPool,
    pub(super) metrics: Option<DbMetrics>,
    pub(super) acquire_timeout: Duration,
    pub(super) deadline: Deadline,
    pub(super) access: Access,
    /// Cancelled when the caller's future is dropped.
    pub(super) stop: CancellationToken,
}

type Conn = PoolConnection<Postgres>;
type Reply<T> = oneshot::Sender<Result<T, DbError>>;

/// The caller's reply, which writes the `db` stage's time into the request's log as it
/// answers: the handler builds its response (and `Server-Timing`) as soon as the answer
/// arrives, while this task may still be rolling back or returning the connection.
struct Answer<'a, T> {
    reply: Reply<T>,
    started: Instant,
    deadline: &'a Deadline,
}

impl<T> Answer<'_, T> {
    fn send(self, result: Result<T, DbError>) {
        self.deadline
            .log()
            .record(Stage::Db, self.started.elapsed());
        // A caller that has gone reads nothing; there is no one to tell.
        drop(self.reply.send(result));
    }
}

/// How a statement under [`Job::guarded`] ended.
enum Guarded<O> {
    /// It finished; `cancelled` says whether a cancel was sent while it ran (the
    /// deadline passed or the caller went away), in which case nothing may be committed.
    Finished { output: O, cancelled: bool },
    /// It did not come back even after a cancel: the connection is given up.
    Abandoned,
}

impl Job {
    /// Runs the whole transaction and answers on `reply` (exactly once).
    pub(super) async fn run<T, B: Body<T>>(self, body: B, reply: Reply<T>) {
        let waited = self.acquire();
        let mut conn =
            match Instrument::instrument(waited, self.deadline.stage_span(Stage::DbPool)).await {
                Ok(conn) => conn,
                Err(err) => return drop(reply.send(Err(err))),
            };
        self.deadline
            .log()
            .observe_start(Stage::Db, self.deadline.remaining());
        let span = self.deadline.stage_span(Stage::Db);
        let answer = Answer {
            reply,
            started: Instant::now(),
            deadline: &self.deadline,
        };
        let reply = self.transact(&mut conn, body, answer);
        if let Some(Answer { reply, .. }) = Instrument::instrument(reply, span).await {
            // The caller went away before an answer was decided; nobody reads this.
            drop(reply.send(Err(self.deadline.exceeded(Stage::Db).into())));
        }
    }

    /// Stage `db_pool`: a connection within `min(acquire timeout, remaining)`.
    async fn acquire(&self) -> Result<Conn, DbError> {
        let deadline = &self.deadline;
        deadline
            .log()
            .observe_start(Stage::DbPool, deadline.remaining());
        if deadline.is_expired() {
            return Err(deadline.exceeded(Stage::DbPool).into());
        }
        let _waiting = self.metrics.as_ref().map(Pending::enter);
        let started = Instant::now();
        let until = deadline.instant().min(started + self.acquire_timeout);
        let acquired = timeout_at(until, self.pool.acquire()).await;
        deadline.log().record(Stage::DbPool, started.elapsed());
        let conn = match acquired {
            Ok(Ok(conn)) => conn,
            Ok(Err(err)) => return Err(classify(err, deadline, Stage::DbPool)),
            Err(_) if deadline.is_expired() => return Err(deadline.exceeded(Stage::DbPool).into()),
            Err(_) => return Err(classify(sqlx::Error::PoolTimedOut, deadline, Stage::DbPool)),
        };
        // The wait may have used the budget up: then no statement starts at all.
        if deadline.remaining() < MIN_STEP {
            return Err(deadline.exceeded(Stage::DbPool).into());
        }
        Ok(conn)
    }

    /// `BEGIN`, the body, then `COMMIT` or `ROLLBACK`. Returns `reply` if it was not used.
    async fn transact<'a, T, B: Body<T>>(
        &self,
        conn: &mut Conn,
        body: B,
        reply: Answer<'a, T>,
    ) -> Option<Answer<'a, T>> {
        if self.stop.is_cancelled() {
            return Some(reply); // The caller left while we waited for the pool.
        }
        let pid = match self.begin(conn).await {
            Ok(pid) => pid,
            Err(err) => {
                reply.send(Err(err));
                return None;
            }
        };
        let ran = {
            let statements = body(conn);
            self.guarded(Some(pid), statements).await
        };
        let (output, cancelled) = match ran {
            Guarded::Finished { output, cancelled } => (output, cancelled),
            Guarded::Abandoned => {
                conn.close_on_drop();
                return Some(reply);
            }
        };
        match output {
            Ok(End::Commit(value)) if !cancelled && !self.stop.is_cancelled() => {
                let committed = self.commit(conn).await;
                reply.send(committed.map(|()| value));
                None
            }
            Ok(End::Commit(_)) => {
                // Too late, or nobody to tell: nothing is written.
                reply.send(Err(self.deadline.exceeded(Stage::Db).into()));
                self.rollback(conn).await;
                None
            }
            Ok(End::Rollback(value)) => {
                reply.send(Ok(value));
                self.rollback(conn).await;
                None
            }
            Err(err) => {
                reply.send(Err(classify(err, &self.deadline, Stage::Db)));
                self.rollback(conn).await;
                None
            }
        }
    }

    /// `BEGIN` with this transaction's limits, in one round trip; returns the backend's
    /// PID, which is what a cancel names.
    async fn begin(&self, conn: &mut Conn) -> Result<i32, DbError> {
        let sql = begin_sql(self.access, server_limit(self.deadline.remaining()));
        let begun = {
            let statement = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(&mut **conn);
            self.guarded(None, statement).await
        };
        let rows: Vec<PgRow> = match begun {
            Guarded::Finished {
                output: Ok(rows),
                cancelled: false,
            } => rows,
            Guarded::Finished {
                output: Ok(_),
                cancelled: true,
            } => {
                self.rollback(conn).await;
                return Err(self.deadline.exceeded(Stage::Db).into());
            }
            Guarded::Finished {
                output: Err(err), ..
            } => {
                self.settle(conn).await;
                return Err(classify(err, &self.deadline, Stage::Db));
            }
            Guarded::Abandoned => {
                conn.close_on_drop();
                return Err(self.deadline.exceeded(Stage::Db).into());
            }
        };
        match rows.last().map(|row| row.try_get::<i32, _>(0)) {
            Some(Ok(pid)) => Ok(pid),
            Some(Err(err)) => {
                self.rollback(conn).await;
                Err(DbError::Query(err))
            }
            None => {
                self.rollback(conn).await;
                Err(DbError::Query(sqlx::Error::RowNotFound))
            }
        }
    }

    /// Runs `statement` to its end. If the deadline passes or the caller goes away
    /// first, the statement is cancelled on the server (by `pid`) and read to its end
    /// anyway, so the connection stays in step; only if even that takes longer than
    /// [`CLEANUP_GRACE`] is it abandoned.
    async fn guarded<F: Future>(&self, pid: Option<i32>, statement: F) -> Guarded<F::Output> {
        let mut statement = pin!(statement);
        tokio::select! {
            biased;
            output = &mut statement => return Guarded::Finished { output, cancelled: false },
            () = tokio::time::sleep_until(self.deadline.instant()) => {}
            () = self.stop.cancelled() => {}
        }
        if let Some(pid) = pid {
            self.cancel_on_server(pid).await;
        }
        match tokio::time::timeout(CLEANUP_GRACE, statement).await {
            Ok(output) => Guarded::Finished {
                output,
                cancelled: true,
            },
            Err(_) => {
                tracing::warn!(
                    pid,
                    "a cancelled statement did not end; closing its connection"
                );
                Guarded::Abandoned
            }
        }
    }

    /// `pg_cancel_backend(pid)`, sent from the side pool. We still hold the connection
    /// and its statement has not come back, so `pid` is ours and busy with it; if the
    /// statement ends in between, PostgreSQL ignores a cancel that reaches an idle
    /// backend (and [`rollback`](Self::rollback) retries the one case it does not).
    async fn cancel_on_server(&self, pid: i32) {
        let sent = sqlx::query("SELECT pg_cancel_backend($1)")
            .bind(pid)
            .execute(&self.cancel_pool);
        match tokio::time::timeout(CLEANUP_GRACE, sent).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::warn!(pid, error = %err, "pg_cancel_backend failed"),
            Err(_) => tracing::warn!(pid, "pg_cancel_backend timed out"),
        }
    }

    /// COMMIT as a point of no return: refused without I/O when too little is left;
    /// sent with `statement_timeout` = what is left (deferred work stops at the
    /// deadline, and the transaction rolls back); its outcome awaited, not abandoned.
    async fn commit(&self, conn: &mut Conn) -> Result<(), DbError> {
        let left = self.deadline.remaining();
        if left < MIN_STEP {
            self.rollback(conn).await;
            return Err(self.deadline.exceeded(Stage::Db).into());
        }
        let sql = commit_sql(server_limit(left));
        let _no_return = self.deadline.point_of_no_return();
        let outcome = timeout_at(
            self.deadline.instant() + COMMIT_GRACE,
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut **conn),
        )
        .await;
        match outcome {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => {
                // A failed COMMIT ends the transaction (rolled back); a failure of the
                // SELECT before it would leave it open and aborted: settle finds out.
                self.settle(conn).await;
                Err(classify(err, &self.deadline, Stage::Db))
            }
            Err(_) => {
                tracing::warn!("no outcome for a COMMIT within the grace; closing its connection");
                conn.close_on_drop();
                Err(DbError::OutcomeUnknown)
            }
        }
    }

    /// `ROLLBACK` of a transaction known to be open. A cancel that arrived just as its
    /// statement ended can hit the `ROLLBACK` instead (57014): then it is sent again.
    async fn rollback(&self, conn: &mut Conn) {
        for _attempt in 0..2 {
            let sent = tokio::time::timeout(
                CLEANUP_GRACE,
                sqlx::raw_sql("ROLLBACK").execute(&mut **conn),
            )
            .await;
            match sent {
                Ok(Ok(_)) => return,
                Ok(Err(sqlx::Error::Database(err))) if err.code().as_deref() == Some("57014") => {}
                _ => break,
            }
        }
        conn.close_on_drop();
    }

    /// After an error whose place is unknown: is a transaction still open? `SELECT 1`
    /// succeeds only outside an aborted transaction; in one it fails with 25P02 and a
    /// `ROLLBACK` follows. (A `ROLLBACK` sent blindly would make the server warn.)
    async fn settle(&self, conn: &mut Conn) {
        let probe = tokio::time::timeout(
            CLEANUP_GRACE,
            sqlx::raw_sql("SELECT 1").execute(&mut **conn),
        )
        .await;
        match probe {
            Ok(Ok(_)) => {}
            Ok(Err(sqlx::Error::Database(err))) if err.code().as_deref() == Some("25P02") => {
                self.rollback(conn).await;
            }
            _ => conn.close_on_drop(),
        }
    }
}

/// The server-side limit for a step with `left` of the budget: a little less, so the
/// server stops first, and at least 1 ms (0 would mean "no limit").
fn server_limit(left: Duration) -> u128 {
    left.saturating_sub(SERVER_MARGIN)
        .max(Duration::from_millis(1))
        .as_millis()
}

/// Counts a request waiting for a connection, also when its future is dropped.
struct Pending(prometheus_client::metrics::gauge::Gauge);

impl Pending {
    fn enter(metrics: &DbMetrics) -> Self {
        let gauge = metrics.pending().clone();
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.dec();
    }
}
