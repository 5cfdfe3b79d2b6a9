//! [`Job`]: one transaction on a task that owns its connection (see the module docs of
//! [`db`](super) for why).
//!
//! The job answers its caller through their [`Handoff`] as soon as the answer is known,
//! then finishes its cleanup: the cancelled statement's error read, `ROLLBACK` sent, the
//! connection back in the pool in step with the server (or closed, when that cannot be
//! made sure of).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt as _;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgDatabaseError, PgPool, PgSeverity};
use sqlx::{Connection as _, Postgres};
use tokio::time::{Instant, timeout, timeout_at};
use tracing::Instrument;

use super::backend::{Backend, Backends, CANCEL, IN_TRANSACTION, Session};
use super::limit::{Change, SessionLimit};
use super::sql::{Access, begin_sql, commit_sql, run_batch};
use super::{Check, DbError, End, PING_AFTER_IDLE, Statements, classify};
use crate::deadline::Deadline;
use crate::stage::Stage;

/// How much earlier than the deadline the server is told to give up. `statement_timeout`
/// counts from the start of each statement, which comes a round trip after it is set;
/// the margin covers that, so the server usually stops first and the client-side cancel
/// at the deadline is the exception.
const SERVER_MARGIN: Duration = Duration::from_millis(10);

/// The least budget for which a step (the first statement, or COMMIT) is started: less
/// than this leaves the server no time of its own, so the step is refused without I/O.
const MIN_STEP: Duration = Duration::from_millis(12);

/// How long past the deadline the job waits to learn the outcome of a COMMIT it sent.
/// The COMMIT batch carries `statement_timeout` = what was left and is cancelled at the
/// deadline, so the server normally answers before the deadline; this covers a slow WAL
/// flush or network, and learning the outcome of a COMMIT whose connection was lost.
/// Shorter than [`NO_RETURN_GRACE`](crate::deadline::NO_RETURN_GRACE), the ingress
/// layer's backstop.
pub(crate) const COMMIT_GRACE: Duration = Duration::from_millis(250);

/// How long a cancelled statement (or a `ROLLBACK`) may take to come back before the
/// connection is given up and closed instead of returned.
const CLEANUP_GRACE: Duration = Duration::from_secs(2);

/// How often a cancel is sent again while the statement has not come back. PostgreSQL
/// ignores a cancel that reaches a backend between two statements, so one cancel is not
/// enough when the body starts another statement after it.
const RECANCEL_EVERY: Duration = Duration::from_millis(25);

/// How long a cancel itself may take. One that has not answered by then may still land
/// later, so the connection it was aimed at is closed rather than returned.
const CANCEL_TIMEOUT: Duration = Duration::from_millis(500);

/// How often the side connection looks whether a transaction whose connection was lost
/// during COMMIT has ended on the server.
const OUTCOME_POLL: Duration = Duration::from_millis(5);

/// Everything one transaction needs, moved onto its task.
pub(super) struct Job<T> {
    pub(super) pool: PgPool,
    /// Cancels, and learns outcomes, on connections of its own.
    pub(super) side_pool: PgPool,
    /// Requests waiting for a connection (the pool's count).
    pub(super) pending: Arc<AtomicUsize>,
    pub(super) acquire_timeout: Duration,
    pub(super) deadline: Deadline,
    pub(super) access: Access,
    /// The pool's connections' backends, learned once per connection.
    pub(super) backends: Arc<Backends>,
    /// This transaction's backend, once its connection is known (cancels aim at it).
    pub(super) backend: OnceLock<Backend>,
    /// The limit this transaction sent, if the one in force did not serve: in force on
    /// the session once it commits, undone once it rolls back.
    pub(super) limit_sent: OnceLock<Change>,
    /// Whether the schema can leave work to COMMIT (then it is fired before it).
    pub(super) deferred: bool,
    /// A cancel was sent whose outcome is unknown: the connection must not be reused.
    pub(super) cancel_unsettled: AtomicBool,
    /// Who answers the caller, the answer, how far the job got, and whether the caller
    /// has stopped waiting (shared with the caller).
    pub(super) handoff: Arc<Handoff<T>>,
}

/// What the caller and its job share, in one allocation. Exactly one of them answers:
/// the job, when it knows the outcome in time, or the caller, at the deadline, when it
/// does not. The one that claims the answer first counts it and records its stage time;
/// the other stays silent. The job claims it before it sends COMMIT, so a COMMIT's
/// outcome is always the job's to tell, and a caller at its deadline then waits for it.
///
/// Why not a channel and a cancellation token: a transaction that ends in time is
/// polled by its caller (`Detach` in `mod.rs`), so its answer is read right after the
/// poll that wrote it and needs no waker of its own; and only the caller ever stops the
/// job, once. A oneshot channel and a `CancellationToken` (a mutex behind every clone,
/// drop and wait) would each add an allocation and its bookkeeping to every order;
/// this is one allocation and a few atomics.
///
/// The stop is the job's deadline too: the caller sets it when its own timer at the
/// deadline fires, so the job arms no timer of its own (one registered with the
/// runtime per order, for a deadline the caller already watches). The stop has no
/// waker. The caller sets it only just before the job is polled again: at its
/// deadline, before it polls the job once more for an answer the job has claimed (a
/// COMMIT on the wire), or as it stops polling the job and hands it to a task of its
/// own, whose first poll reads it. A waker would only wake the caller's own task in
/// the middle of its poll (the cost `answer_of` avoids).
pub(super) struct Handoff<T> {
    answered: AtomicBool,
    /// When the job had its connection: the `db` stage began (unset: still `db_pool`).
    connected_at: OnceLock<Instant>,
    /// The answer, from the job that claimed it to the caller that reads it.
    answer: Mutex<Option<Result<T, DbError>>>,
    /// The caller has gone (its future dropped), or its deadline passed.
    stopped: AtomicBool,
}

impl<T> Handoff<T> {
    pub(super) fn new() -> Self {
        Self {
            answered: AtomicBool::new(false),
            connected_at: OnceLock::new(),
            answer: Mutex::new(None),
            stopped: AtomicBool::new(false),
        }
    }

    /// Takes the answer for whoever calls first; `false` for every later call.
    pub(super) fn claim(&self) -> bool {
        !self.answered.swap(true, Ordering::AcqRel)
    }

    /// The stage a 504 at the deadline names: `db` once the job had its connection.
    pub(super) fn stage(&self) -> Stage {
        if self.connected_at.get().is_some() {
            Stage::Db
        } else {
            Stage::DbPool
        }
    }

    /// Records the `db` stage's time so far into `deadline`'s log (once connected).
    pub(super) fn record_db(&self, deadline: &Deadline) {
        if let Some(started) = self.connected_at.get() {
            deadline.log().record(Stage::Db, started.elapsed());
        }
    }

    /// The answer, once the job has given it (the caller reads it after each poll).
    pub(super) fn take_answer(&self) -> Option<Result<T, DbError>> {
        lock(&self.answer).take()
    }

    /// The job's answer; only the one that claimed it gives it.
    fn give_answer(&self, result: Result<T, DbError>) {
        *lock(&self.answer) = Some(result);
    }

    /// Tells the job that its deadline passed or nobody waits for its answer any more:
    /// it stops its statement on the server. Only just before the job is polled again
    /// (see above).
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Ready once the caller has stopped, as the job is polled (no waker: see above).
    fn stopped(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|_| {
            if self.is_stopped() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }
}

/// The slot's lock. A panic while it is held cannot leave a half-written answer (it
/// holds an `Option`, replaced whole), so a poisoned lock is used as it is.
fn lock<T>(slot: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

type Conn = PoolConnection<Postgres>;

/// A failed step's error, made only if it is the answer: making it counts a deadline
/// (`deadline_exceeded_total`), which must happen once per request, by whoever answers.
type Failure<'a> = Box<dyn FnOnce() -> DbError + Send + 'a>;
/// The caller's reply. It is given only if the job claims the answer (see [`Handoff`]);
/// the result is made only then, so a deadline the caller has already answered is not
/// counted twice. Giving it writes the `db` stage's time into the request's log: the
/// handler builds its response (and `Server-Timing`) as soon as the answer arrives,
/// while this task may still be rolling back or returning the connection.
struct Answer<'a, T> {
    handoff: &'a Handoff<T>,
    deadline: &'a Deadline,
    claimed: bool,
}

impl<T> Answer<'_, T> {
    /// Claims the answer ahead of sending it (before COMMIT: its outcome is the job's to
    /// tell); `false` when the caller has answered already or gone.
    fn claim(&mut self) -> bool {
        self.claimed = self.claimed || self.handoff.claim();
        self.claimed
    }

    fn send(mut self, result: impl FnOnce() -> Result<T, DbError>) {
        if !self.claim() {
            return; // The caller answered at its deadline, or went away.
        }
        self.handoff.record_db(self.deadline);
        // A caller that has gone reads nothing; there is no one to tell.
        self.handoff.give_answer(result());
    }
}

/// How a statement under [`Job::guarded`] ended.
enum Guarded<O> {
    /// It finished; `cancelled` says whether a cancel was sent while it ran (the
    /// deadline passed or the caller went away), in which case nothing may be committed.
    Finished { output: O, cancelled: bool },
    /// It did not come back even after cancels: the connection is given up.
    Abandoned,
}

impl<T: Send> Job<T> {
    /// Runs the whole transaction and answers through the handoff (at most once, and
    /// only if the caller has not answered itself at its deadline).
    pub(super) async fn run<B: Statements<T>>(self, body: B) {
        let acquired = self
            .acquire()
            .instrument(self.deadline.stage_span(Stage::DbPool))
            .await;
        let (mut conn, session) = match acquired {
            Ok(taken) => taken,
            Err(err) => {
                if self.handoff.claim() {
                    self.handoff.give_answer(Err(err()));
                }
                return;
            }
        };
        let connected_at = Instant::now();
        let remaining = self.deadline.remaining_at(connected_at);
        self.deadline.log().observe_start(Stage::Db, remaining);
        let _ = self.handoff.connected_at.set(connected_at);
        let span = self.deadline.stage_span(Stage::Db);
        let answer = Answer {
            handoff: &self.handoff,
            deadline: &self.deadline,
            claimed: false,
        };
        // Boxed before it is wrapped (span, unwind guard): a wrapper moves what it wraps
        // by value, so each moves a pointer.
        let transacted = Box::pin(self.transact(&mut conn, session, body, answer));
        // A body that panics mid-transaction must not hand its connection back with the
        // transaction open (holding its locks, for the next request to run in): the
        // panic is caught here, where the connection is still ours to close. The caller
        // then reads a closed channel.
        match AssertUnwindSafe(Instrument::instrument(transacted, span))
            .catch_unwind()
            .await
        {
            Ok(Some(answer)) => {
                // Nothing decided an answer: the deadline passed or the caller went away.
                answer.send(|| Err(self.deadline.exceeded(Stage::Db).into()));
            }
            Ok(None) => {}
            Err(_) => {
                tracing::error!("a transaction's body panicked; closing its connection");
                conn.close_on_drop();
            }
        }
        if self.cancel_unsettled.load(Ordering::Relaxed) {
            conn.close_on_drop();
        }
    }

    /// Stage `db_pool`: a connection within `min(acquire timeout, remaining)`, with its
    /// session when that is known already. A failure comes as the means to make its
    /// error, so that it is counted only if it is the answer.
    async fn acquire(&self) -> Result<(Conn, Option<Session>), Failure<'_>> {
        let deadline = &self.deadline;
        let started = Instant::now();
        let remaining = deadline.remaining_at(started);
        deadline.log().observe_start(Stage::DbPool, remaining);
        if remaining.is_zero() {
            return Err(Box::new(|| deadline.exceeded(Stage::DbPool).into()));
        }
        let _waiting = Pending::enter(&self.pending);
        let until = deadline.instant().min(started + self.acquire_timeout);
        let acquired = match self.take_idle(started, until).await {
            Some((conn, session)) => Ok(Ok((conn, Some(session)))),
            None => {
                // sqlx's wait for a connection is a future of kilobytes (it holds a whole
                // connect). Moved by value, every future that holds it would copy it, and
                // `Box::pin` copies it once from the stack into the box; written into a
                // box allocated first, it is made where it stays.
                let waited = Box::write(Box::new_uninit(), self.pool.acquire());
                let acquired = timeout_at(until, Box::into_pin(waited)).await;
                acquired.map(|acquired| acquired.map(|conn| (conn, None)))
            }
        };
        deadline.log().record(Stage::DbPool, started.elapsed());
        let taken = match acquired {
            Ok(Ok(taken)) => taken,
            Ok(Err(err)) => return Err(Box::new(move || classify(err, deadline, Stage::DbPool))),
            Err(_) if deadline.is_expired() => {
                return Err(Box::new(|| deadline.exceeded(Stage::DbPool).into()));
            }
            Err(_) => {
                return Err(Box::new(|| {
                    classify(sqlx::Error::PoolTimedOut, deadline, Stage::DbPool)
                }));
            }
        };
        // The wait may have used the budget up: then no statement starts at all.
        if deadline.remaining() < MIN_STEP {
            return Err(Box::new(|| deadline.exceeded(Stage::DbPool).into()));
        }
        Ok(taken)
    }

    /// A connection the pool holds idle, taken at once: no timer, and none of sqlx's
    /// wait (its semaphore, its close listener, its own timeout), which cost about
    /// 3,000 instructions of every order although a connection was there to take.
    ///
    /// sqlx's check on a connection's way out of the pool (a ping when it sat idle for
    /// over a second, `mod.rs`) does not run on this path, so it is made here, from
    /// the session's last use (`LastUse`). A connection that fails it, or whose
    /// session cannot be learned in time, is closed (a step cut halfway leaves it out
    /// of step), and the pool's wait, which checks what it hands out, finds another.
    async fn take_idle(&self, now: Instant, until: Instant) -> Option<(Conn, Session)> {
        let mut conn = self.pool.try_acquire()?;
        let checked = timeout_at(until, async {
            let session = self.backends.of(&mut conn).await?;
            if session.last_use.renew(now) > PING_AFTER_IDLE {
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

    /// `BEGIN`, the body, then `COMMIT` or `ROLLBACK`. Returns the answer if nothing
    /// decided it (the caller left, or the statements were abandoned).
    async fn transact<'a, B: Statements<T>>(
        &'a self,
        conn: &mut Conn,
        session: Option<Session>,
        body: B,
        answer: Answer<'a, T>,
    ) -> Option<Answer<'a, T>> {
        if self.handoff.is_stopped() {
            return Some(answer); // The caller left while we waited for the pool.
        }
        let limit = match self.identify(conn, session).await {
            Ok(limit) => limit,
            Err(failure) => {
                answer.send(|| Err(failure()));
                return None;
            }
        };
        if let Err(failure) = self.begin(conn, &limit).await {
            answer.send(|| Err(failure()));
            return None;
        }
        let ran = {
            let statements = body(conn);
            self.guarded(statements, CLEANUP_GRACE).await
        };
        let (output, cancelled) = match ran {
            Guarded::Finished { output, cancelled } => (output, cancelled),
            Guarded::Abandoned => {
                conn.close_on_drop();
                return Some(answer);
            }
        };
        let (value, check) = match output {
            Ok(End::Commit(value)) => (value, None),
            Ok(End::CommitVerified(value, check)) => (value, Some(check)),
            Ok(End::Rollback(value)) => {
                answer.send(|| Ok(value));
                self.rollback(conn).await;
                return None;
            }
            Err(err) => {
                answer.send(|| Err(classify(err, &self.deadline, Stage::Db)));
                self.rollback(conn).await;
                return None;
            }
        };
        if cancelled || self.handoff.is_stopped() {
            // Too late, or nobody to tell: nothing is written.
            answer.send(|| Err(self.deadline.exceeded(Stage::Db).into()));
            self.rollback(conn).await;
            return None;
        }
        self.commit(conn, value, check, answer).await;
        None
    }

    /// The connection's backend, so a cancel can reach it: known already when the
    /// connection was taken idle, else looked up (no I/O) for every transaction but a
    /// connection's first. A connection whose backend could not be learned in time, or
    /// whose caller left meanwhile, is closed: a statement cut halfway leaves it out of
    /// step, and nothing else would stop its backend.
    async fn identify(
        &self,
        conn: &mut Conn,
        known: Option<Session>,
    ) -> Result<Arc<SessionLimit>, Failure<'_>> {
        // A connection the pool's wait handed out: its use is renewed here.
        let waited_for = known.is_none();
        let learned = match known {
            Some(session) => Some(Ok(session)),
            None => tokio::select! {
                learned = self.backends.of(conn) => Some(learned),
                () = self.handoff.stopped() => None,
            },
        };
        match learned {
            Some(Ok(session)) => {
                if waited_for {
                    session.last_use.renew(Instant::now());
                }
                let _ = self.backend.set(session.backend);
                Ok(session.limit)
            }
            Some(Err(err)) => {
                conn.close_on_drop();
                Err(Box::new(move || classify(err, &self.deadline, Stage::Db)))
            }
            None => {
                conn.close_on_drop();
                Err(Box::new(|| self.deadline.exceeded(Stage::Db).into()))
            }
        }
    }

    /// `BEGIN`, with this transaction's limit where the one in force on the session
    /// does not serve it, in one round trip.
    async fn begin(&self, conn: &mut Conn, limit: &Arc<SessionLimit>) -> Result<(), Failure<'_>> {
        let change = limit.plan(server_limit(self.deadline.remaining()));
        let sql = begin_sql(self.access, change.as_ref().map(Change::ms));
        if let Some(change) = change {
            let _ = self.limit_sent.set(change);
        }
        let begun = {
            let sent = run_batch(conn, sql);
            self.guarded(sent, CLEANUP_GRACE).await
        };
        // Made only on the way out: a boxed closure is an allocation, and the happy path
        // needs none.
        let exceeded = || -> Failure<'_> { Box::new(|| self.deadline.exceeded(Stage::Db).into()) };
        match begun {
            Guarded::Finished {
                output: Ok(_),
                cancelled: false,
            } => Ok(()),
            Guarded::Finished {
                output: Ok(_),
                cancelled: true,
            } => {
                self.rollback(conn).await;
                Err(exceeded())
            }
            Guarded::Finished {
                output: Err(err), ..
            } => {
                self.settle(conn).await;
                Err(Box::new(move || classify(err, &self.deadline, Stage::Db)))
            }
            Guarded::Abandoned => {
                conn.close_on_drop();
                Err(exceeded())
            }
        }
    }

    /// Runs `statement` to its end. If the caller stops first (its deadline passed, or
    /// it went away: see [`Handoff`]), the statement is cancelled on the server, again
    /// every [`RECANCEL_EVERY`] until it comes back (the body may start another
    /// statement after a cancel found the backend idle), and read to its end anyway, so
    /// the connection stays in step. Only if even that takes until `give_up_after` past
    /// the first cancel is the connection abandoned.
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
        // The cancel path is boxed: it is rare, and sqlx's futures are large, so left
        // inline they would make every step's future (moved by value as the happy path
        // runs) as large as the cancel's.
        Box::pin(self.cancel_until_ended(statement, give_up)).await
    }

    /// [`guarded`](Self::guarded) past the deadline: cancels until the statement ends.
    async fn cancel_until_ended<F: Future>(
        &self,
        mut statement: Pin<&mut F>,
        give_up: Instant,
    ) -> Guarded<F::Output> {
        loop {
            // The statement is read while the cancel is on its way; a cancel in flight is
            // awaited even when the statement ends first, so none is left behind.
            let next = (Instant::now() + RECANCEL_EVERY).min(give_up);
            let (output, ()) =
                tokio::join!(timeout_at(next, &mut statement), self.cancel_on_server());
            match output {
                Ok(output) => {
                    return Guarded::Finished {
                        output,
                        cancelled: true,
                    };
                }
                Err(_) if Instant::now() >= give_up => {
                    tracing::warn!(
                        backend = self.backend.get().map(|b| b.pid),
                        "a cancelled statement did not end; closing its connection"
                    );
                    return Guarded::Abandoned;
                }
                Err(_) => {}
            }
        }
    }

    /// Cancels whatever this transaction's backend is running, from the side pool. The
    /// job holds the connection until the cancel has answered, so the backend runs
    /// nothing else meanwhile (see `backend.rs`); a cancel whose own fate is unknown (it
    /// failed, or did not answer in time, or the backend is not known) marks the
    /// connection for closing, since it might still land on a later transaction.
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
            "a cancel's fate is unknown; the connection will be closed"
        );
        self.cancel_unsettled.store(true, Ordering::Relaxed);
    }

    /// COMMIT as a point of no return: refused without I/O when too little is left;
    /// where the schema can defer work to COMMIT, sent with `statement_timeout` = what
    /// is left and that work fired before it under the limit (so slow deferred work
    /// stops at the deadline and rolls back);
    /// cancelled at the deadline (which still aborts it before the commit record); its
    /// outcome awaited, and answered only as the server or the table tells it.
    async fn commit(
        &self,
        conn: &mut Conn,
        value: T,
        check: Option<Check>,
        mut answer: Answer<'_, T>,
    ) {
        let left = self.deadline.remaining();
        // From the COMMIT on, its outcome is this job's to tell, so the answer is claimed
        // first; a caller that answered at its deadline already has a 504, and then no
        // COMMIT may be sent.
        if left < MIN_STEP || !answer.claim() {
            answer.send(|| Err(self.deadline.exceeded(Stage::Db).into()));
            self.rollback(conn).await;
            return;
        }
        let sql = commit_sql(self.deferred, server_limit(left));
        let _no_return = self.deadline.point_of_no_return();
        let sent = {
            let sent = run_batch(conn, sql);
            // Cancelled at the deadline, its outcome awaited for the grace at most.
            self.guarded(sent, COMMIT_GRACE).await
        };
        match sent {
            // Committed, even if a cancel arrived after the commit record (PostgreSQL
            // holds interrupts from there on and completes the COMMIT).
            Guarded::Finished { output: Ok(_), .. } => {
                if let Some(change) = self.limit_sent.get() {
                    change.committed();
                }
                answer.send(|| Ok(value));
            }
            Guarded::Finished {
                output: Err(err), ..
            } if proves_rollback(&err) => {
                answer.send(|| Err(classify(err, &self.deadline, Stage::Db)));
                self.settle(conn).await;
            }
            Guarded::Finished {
                output: Err(err), ..
            } => {
                tracing::warn!(error = %err, "the connection failed during COMMIT");
                conn.close_on_drop();
                // Boxed, as the cancel path is: rare, and large.
                let learned = Box::pin(self.learn_outcome(check)).await;
                answer.send(|| learned.map(|()| value));
            }
            Guarded::Abandoned => {
                tracing::warn!("no outcome for a COMMIT within the grace; closing its connection");
                conn.close_on_drop();
                answer.send(|| Err(DbError::OutcomeUnknown));
            }
        }
    }

    /// The outcome of a COMMIT whose connection failed, learned on another connection
    /// within the grace: once its backend is out of the transaction (idle, or gone), the
    /// transaction has ended one way or the other, and `check` reads the table. Without
    /// a check, or without an answer in time, the outcome is unknown.
    async fn learn_outcome(&self, check: Option<Check>) -> Result<(), DbError> {
        let Some(check) = check else {
            return Err(DbError::OutcomeUnknown);
        };
        let learned = timeout_at(self.deadline.instant() + COMMIT_GRACE, async {
            let mut side = self.side_pool.acquire().await?;
            loop {
                // No COMMIT is sent before the backend is known; were it not, the outcome
                // could not be learned.
                let Some(backend) = self.backend.get() else {
                    return Err(sqlx::Error::Protocol("the backend is not known".into()));
                };
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

    /// `ROLLBACK` of a transaction known to be open. A cancel that arrived just as its
    /// statement ended can hit the `ROLLBACK` instead (57014): then it is sent again.
    async fn rollback(&self, conn: &mut Conn) {
        for _attempt in 0..2 {
            let sent = timeout(
                CLEANUP_GRACE,
                sqlx::raw_sql("ROLLBACK").execute(&mut **conn),
            )
            .await;
            match sent {
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

    /// After an error whose place is unknown: is a transaction still open? `SELECT 1`
    /// succeeds only outside an aborted transaction; in one it fails with 25P02 and a
    /// `ROLLBACK` follows. (A `ROLLBACK` sent blindly would make the server warn.)
    async fn settle(&self, conn: &mut Conn) {
        let probe = timeout(
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

/// Whether an error answered to the COMMIT batch proves that nothing was committed. Only
/// an error the server reports while the session goes on does: PostgreSQL reports
/// nothing but `PANIC` once the commit record is written, so an `ERROR` came from a
/// statement before it (the limit, deferred work, a serialization check) and the
/// transaction is rolled back. A lost connection, a `FATAL` (the session was
/// terminated, perhaps after the commit record), a protocol error or anything else
/// proves nothing.
fn proves_rollback(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    let Some(pg) = db.try_downcast_ref::<PgDatabaseError>() else {
        return false;
    };
    let code = pg.code();
    pg.severity() == PgSeverity::Error
        && !code.starts_with("08")
        && !code.starts_with("57P")
        && !code.starts_with("XX")
}

/// The server-side limit for a step with `left` of the budget: a little less, so the
/// server stops first, and at least 1 ms (0 would mean "no limit").
fn server_limit(left: Duration) -> u64 {
    let ms = left
        .saturating_sub(SERVER_MARGIN)
        .max(Duration::from_millis(1))
        .as_millis();
    // A budget is clamped to seconds at the ingress, so this never saturates; were it
    // to, the value stays clear of the `u64::MAX` that `limit.rs` keeps for "unknown".
    u64::try_from(ms).unwrap_or(u64::MAX / 2)
}

/// Counts a request waiting for a connection, also when its future is dropped.
struct Pending<'a>(&'a AtomicUsize);

impl<'a> Pending<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
