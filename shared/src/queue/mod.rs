//! A job queue in PostgreSQL whose jobs carry their caller's deadline, on the
//! database's clock: an expired job never starts, and a job whose caller was told
//! "timed out" never takes effect.
//!
//! A message broker's expiry is checked on someone's clock at some point of the
//! message's way; none of them ties it to the job's effect. Here the queue is a table
//! ([`SCHEMA`]) of the database that also takes the job's effect, so both can be
//! decided in one transaction:
//!
//! 1. [`Queue::enqueue`] sends what is left of the caller's budget, relative (as
//!    `grpc-timeout` is), and the database turns it into `deadline_at =
//!    clock_timestamp() + left`: the hosts' clocks never enter.
//! 2. [`Queue::claim`] takes the oldest job with `FOR UPDATE SKIP LOCKED`, never one
//!    whose deadline is nearer than [`QueueConfig::min_useful`].
//! 3. [`Queue::run`] runs the work under a [`Deadline`] made from what is left, through
//!    [`Db::transaction`] (statement limits, a cancel at the deadline), and ends it
//!    with a fence in the same transaction: the job moves to `done` only while this
//!    attempt still holds it and its deadline is ahead. No row: the effect rolls back.
//!    COMMIT stays the one point of no return.
//! 4. [`Queue::wait`] is the caller's side: the job's result, or at the caller's own
//!    time, the job expired in one statement. That statement and the fence take the
//!    same row lock, and under READ COMMITTED the one that waits re-checks the row as
//!    the other left it, so "expired" and "done" can never both succeed.
//!
//! An idle worker need not poll: each enqueue notifies [`CHANNEL`] (PostgreSQL's
//! `NOTIFY`, sent at COMMIT) with the queue's name, so a worker that `LISTEN`s claims
//! at once and looks on its own only now and then (a notice can be lost with its
//! connection, and an abandoned job's lease lapses without one).
//!
//! A job enqueued without a deadline is the same queue in legacy mode: it runs
//! whenever a worker reaches it, which is what the experiment compares against.
//!
//! A worker killed mid-job leaves its transaction to roll back; its claim lapses after
//! [`QueueConfig::lease`] and the job is claimed again only while its deadline is ahead.
//! The fence names the attempt, so a worker that lost its claim cannot finish the job:
//! the effect lands at most once.

mod sql;

use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::PgConnection;
use tokio::time::Instant;

use crate::db::{Check, Db, DbError, End};
use crate::deadline::Deadline;

/// The tables the queue expects (`queue_jobs`, `queue_attempts`), to put into a
/// migration of your own.
pub const SCHEMA: &str = include_str!("schema.sql");

/// The channel every enqueue notifies when it commits, the queue's name the payload:
/// `LISTEN` to it (sqlx's `PgListener`) to wake idle workers instead of polling.
pub const CHANNEL: &str = "queue_jobs";

/// The longest a claim, a release or a sweep may take: each is one short statement.
const HOUSEKEEPING: Duration = Duration::from_secs(2);

/// A queue's settings.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct QueueConfig {
    /// The least time a job must have left to be claimed (100 ms): a job that cannot
    /// finish in time is never started.
    pub min_useful: Duration,
    /// How long a claim holds a job (30 s), and the longest an attempt runs: a running
    /// job past its lease is taken as abandoned and may be claimed again.
    pub lease: Duration,
    /// Attempts before a job whose work keeps failing is given up as `failed` (3).
    pub max_attempts: u32,
    /// How soon a waiting caller first reads its job's state again (20 ms); the pause
    /// doubles after each read, up to eight times this.
    pub poll: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            min_useful: Duration::from_millis(100),
            lease: Duration::from_secs(30),
            max_attempts: 3,
            poll: Duration::from_millis(20),
        }
    }
}

/// One named queue in the tables of [`SCHEMA`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Queue {
    db: Db,
    name: String,
    config: QueueConfig,
}

/// Where a job is, as its table says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for a worker.
    Queued,
    /// A worker holds it; its effect may still land.
    Running,
    /// Its effect is committed (with the job's result).
    Done,
    /// Its deadline passed or its caller expired it: it never takes effect.
    Expired,
    /// Its work failed on every attempt: no effect.
    Failed,
}

impl JobState {
    /// The state's name in the table and in answers.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Expired => "expired",
            JobState::Failed => "failed",
        }
    }

    /// Whether the job can still change (queued or running).
    pub fn is_open(self) -> bool {
        matches!(self, JobState::Queued | JobState::Running)
    }

    fn parse(state: &str) -> Result<Self, sqlx::Error> {
        Ok(match state {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "done" => JobState::Done,
            "expired" => JobState::Expired,
            "failed" => JobState::Failed,
            other => return Err(sqlx::Error::Decode(format!("job state {other:?}").into())),
        })
    }
}

/// A job as its table says: its state, and once done, what its work returned.
#[derive(Clone, Debug)]
pub struct JobStatus {
    /// The job's id.
    pub id: i64,
    /// Where it is.
    pub state: JobState,
    /// What its work returned (done only).
    pub result: Option<serde_json::Value>,
}

/// A job this worker holds, to [run](Queue::run).
#[derive(Debug)]
pub struct Claimed {
    /// The job's id.
    pub id: i64,
    /// Which claim of the job this is (1 for the first).
    pub attempt: i32,
    /// What the producer enqueued.
    pub payload: serde_json::Value,
    /// How long the job waited from its enqueue to this claim, on the database's clock.
    pub waited: Duration,
    /// What the attempt runs under: what is left of the job's deadline, at most the
    /// lease.
    pub deadline: Deadline,
}

/// How an attempt ended.
#[derive(Debug)]
pub enum Ran {
    /// The effect and `done` committed together; the work's result.
    Done(serde_json::Value),
    /// The fence found the job no longer this attempt's, or its deadline gone: the
    /// effect rolled back.
    Fenced,
}

/// A job's work: statements on the transaction's connection, returning the job's
/// result. Written like [`Statements`](crate::db::Statements); it must only run SQL.
pub trait Work:
    for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<serde_json::Value, sqlx::Error>>
    + Send
    + 'static
{
}

impl<F> Work for F where
    F: for<'c> FnOnce(
            &'c mut PgConnection,
        ) -> BoxFuture<'c, Result<serde_json::Value, sqlx::Error>>
        + Send
        + 'static
{
}

impl Queue {
    /// The queue `name` on `db`.
    pub fn new(db: Db, name: impl Into<String>, config: QueueConfig) -> Self {
        Self {
            db,
            name: name.into(),
            config,
        }
    }

    /// The queue's settings.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Adds a job, in its own transaction under `deadline`. `by` is the instant on
    /// this host's clock by which the job must be done, `None` for none (legacy). What
    /// is left until it is read as the insert is sent, so the wait for a connection does
    /// not lengthen the job's life.
    pub async fn enqueue(
        &self,
        deadline: &Deadline,
        payload: &serde_json::Value,
        by: Option<Instant>,
    ) -> Result<i64, DbError> {
        let (name, payload) = (self.name.clone(), payload.to_string());
        self.db
            .transaction(deadline, move |conn| {
                let left = by.map(|by| millis(by.saturating_duration_since(Instant::now())));
                Box::pin(async move {
                    let id = sqlx::query_scalar(sql::ENQUEUE)
                        .bind(name)
                        .bind(payload)
                        .bind(left)
                        .fetch_one(conn)
                        .await?;
                    Ok(End::Commit(id))
                })
            })
            .await
    }

    /// Takes the oldest job that has time enough left, or a running one whose lease
    /// has passed; `None` when there is none.
    pub async fn claim(&self) -> Result<Option<Claimed>, DbError> {
        let (name, config) = (self.name.clone(), self.config);
        let row: Option<(i64, i32, String, f64, Option<f64>)> = self
            .db
            .transaction(&Deadline::after(HOUSEKEEPING), move |conn| {
                Box::pin(async move {
                    let row = sqlx::query_as(sql::CLAIM)
                        .bind(name)
                        .bind(millis(config.min_useful))
                        .bind(millis(config.lease))
                        .fetch_optional(conn)
                        .await?;
                    Ok(End::Commit(row))
                })
            })
            .await?;
        let Some((id, attempt, payload, waited_s, left_ms)) = row else {
            return Ok(None);
        };
        let left = left_ms.map_or(config.lease, |ms| {
            let left = Duration::try_from_secs_f64(ms.max(0.0) / 1000.0);
            left.unwrap_or(config.lease).min(config.lease)
        });
        Ok(Some(Claimed {
            id,
            attempt,
            payload: serde_json::from_str(&payload).map_err(|e| DbError::Query(decode(e)))?,
            waited: Duration::try_from_secs_f64(waited_s.max(0.0)).unwrap_or_default(),
            deadline: Deadline::after(left),
        }))
    }

    /// Runs `work` for `job` under what is left of it, then the fence, in one
    /// transaction. On an error or a fence that finds nothing, the attempt is released:
    /// the job is claimable again while time is left, else expired (or failed after
    /// its last attempt).
    pub async fn run(&self, job: Claimed, work: impl Work) -> Result<Ran, DbError> {
        let (id, attempt) = (job.id, job.attempt);
        let done = self
            .db
            .transaction(&job.deadline, move |conn| {
                Box::pin(async move {
                    let result = work(&mut *conn).await?;
                    sqlx::query(sql::END_ATTEMPT)
                        .bind(id)
                        .bind(attempt)
                        .bind("done")
                        .execute(&mut *conn)
                        .await?;
                    // The fence, the last statement before COMMIT: it takes the job's row
                    // lock, so a caller's expire either came first (no row here) or
                    // waits for this transaction's end and then finds it done.
                    let fenced = sqlx::query(sql::FENCE)
                        .bind(id)
                        .bind(attempt)
                        .bind(result.to_string())
                        .execute(&mut *conn)
                        .await?;
                    if fenced.rows_affected() == 0 {
                        return Ok(End::Rollback(None));
                    }
                    Ok(End::CommitVerified(Some(result), done_check(id, attempt)))
                })
            })
            .await;
        match done {
            Ok(Some(result)) => Ok(Ran::Done(result)),
            Ok(None) => {
                self.release(id, attempt, "fenced").await?;
                Ok(Ran::Fenced)
            }
            Err(err) => {
                if let Err(release) = self.release(id, attempt, "failed").await {
                    tracing::warn!(job = id, error = %release, "cannot release a failed job; its lease will");
                }
                Err(err)
            }
        }
    }

    /// Expires, in one statement, the queued jobs that no worker will claim any more
    /// (less than the minimum useful time left), and the abandoned ones past their
    /// deadline; how many.
    pub async fn sweep(&self) -> Result<u64, DbError> {
        let (name, min_useful) = (self.name.clone(), millis(self.config.min_useful));
        self.db
            .transaction(&Deadline::after(HOUSEKEEPING), move |conn| {
                Box::pin(async move {
                    let swept = sqlx::query(sql::SWEEP)
                        .bind(name)
                        .bind(min_useful)
                        .execute(conn)
                        .await?;
                    Ok(End::Commit(swept.rows_affected()))
                })
            })
            .await
    }

    /// The job's state as the table says (a queued job past its deadline is expired:
    /// no worker will start it); `None` for a job of no such id in this queue.
    pub async fn status(&self, deadline: &Deadline, id: i64) -> Result<Option<JobStatus>, DbError> {
        let name = self.name.clone();
        self.db
            .read(deadline, move |conn| {
                Box::pin(async move { read_status(conn, &name, id).await })
            })
            .await
    }

    /// The caller's side of a job it waits for: [`poll`](Self::poll) until `until`
    /// (the instant given to [`enqueue`](Self::enqueue)), then the job expired in one
    /// statement. Done is the result (at most one COMMIT late); expired is a promise
    /// that it never takes effect. Should the expire not be answered within
    /// `deadline`, the job's fate is unknown: [`DbError::OutcomeUnknown`], never a 504.
    pub async fn wait(
        &self,
        deadline: &Deadline,
        id: i64,
        until: Instant,
    ) -> Result<JobStatus, DbError> {
        match self.poll(deadline, id, until).await {
            Some(status) if !status.state.is_open() => Ok(status),
            _ => self.expire(deadline, id).await,
        }
    }

    /// Reads the job's state until it is no longer open or `until` comes, first after
    /// [`QueueConfig::poll`], then twice as long each time up to eight times that (a
    /// crowd of waiting callers must not become the database's load); the last state
    /// read (`None` when none could be). A read that fails changes nothing: the next
    /// one, or the caller's expire, decides.
    pub async fn poll(&self, deadline: &Deadline, id: i64, until: Instant) -> Option<JobStatus> {
        let (mut last, mut pause) = (None, self.config.poll);
        loop {
            match self.status(deadline, id).await {
                Ok(Some(status)) if !status.state.is_open() => return Some(status),
                Ok(status) => last = status,
                Err(err) => tracing::debug!(job = id, error = %err, "cannot read a job's state"),
            }
            let next = Instant::now() + pause;
            if next >= until {
                tokio::time::sleep_until(until).await;
                return last;
            }
            tokio::time::sleep_until(next).await;
            pause = (pause * 2).min(self.config.poll * 8);
        }
    }

    /// Expires the job unless it is done or over, in one statement, then reads where
    /// it is. Any failure leaves its fate unknown ([`DbError::OutcomeUnknown`]).
    pub async fn expire(&self, deadline: &Deadline, id: i64) -> Result<JobStatus, DbError> {
        let name = self.name.clone();
        let expired = self
            .db
            .transaction(deadline, move |conn| {
                Box::pin(async move {
                    sqlx::query(sql::EXPIRE)
                        .bind(id)
                        .bind(&name)
                        .execute(&mut *conn)
                        .await?;
                    // A new statement, so a new snapshot: a fence that made the expire
                    // wait is seen committed.
                    let status = read_status(conn, &name, id).await?;
                    Ok(End::Commit(status))
                })
            })
            .await;
        match expired {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err(DbError::Query(sqlx::Error::RowNotFound)),
            Err(err) => {
                tracing::warn!(job = id, error = %err, "a job's expire was not answered; its fate is unknown");
                Err(DbError::OutcomeUnknown)
            }
        }
    }

    /// The queued jobs now, and the age of the oldest on the database's clock.
    pub async fn backlog(&self, deadline: &Deadline) -> Result<(u64, Duration), DbError> {
        let name = self.name.clone();
        let (depth, oldest_s): (i64, f64) = self
            .db
            .read(deadline, move |conn| {
                Box::pin(sqlx::query_as(sql::BACKLOG).bind(name).fetch_one(conn))
            })
            .await?;
        let oldest = Duration::try_from_secs_f64(oldest_s.max(0.0)).unwrap_or_default();
        Ok((u64::try_from(depth).unwrap_or(0), oldest))
    }

    /// Ends an attempt that did not finish the job: claimable again while time is
    /// left, else expired or failed.
    async fn release(&self, id: i64, attempt: i32, outcome: &'static str) -> Result<(), DbError> {
        let config = self.config;
        self.db
            .transaction(&Deadline::after(HOUSEKEEPING), move |conn| {
                Box::pin(async move {
                    sqlx::query(sql::RELEASE)
                        .bind(id)
                        .bind(attempt)
                        .bind(outcome)
                        .bind(millis(config.min_useful))
                        .bind(i32::try_from(config.max_attempts).unwrap_or(i32::MAX))
                        .execute(conn)
                        .await?;
                    Ok(End::Commit(()))
                })
            })
            .await
    }
}

async fn read_status(
    conn: &mut PgConnection,
    name: &str,
    id: i64,
) -> Result<Option<JobStatus>, sqlx::Error> {
    let row: Option<(String, Option<String>)> = sqlx::query_as(sql::STATUS)
        .bind(id)
        .bind(name)
        .fetch_optional(conn)
        .await?;
    let Some((state, result)) = row else {
        return Ok(None);
    };
    let result = result
        .map(|text| serde_json::from_str(&text).map_err(decode))
        .transpose()?;
    Ok(Some(JobStatus {
        id,
        state: JobState::parse(&state)?,
        result,
    }))
}

/// For a COMMIT whose connection was lost: whether this attempt's `done` is in the
/// table.
fn done_check(id: i64, attempt: i32) -> Check {
    Check::new(read_done(id, attempt))
}

fn read_done(
    id: i64,
    attempt: i32,
) -> impl for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<bool, sqlx::Error>> + Send + 'static
{
    move |conn| {
        Box::pin(async move {
            let done: Option<bool> = sqlx::query_scalar(sql::DONE)
                .bind(id)
                .bind(attempt)
                .fetch_optional(conn)
                .await?;
            Ok(done == Some(true))
        })
    }
}

/// A duration as the milliseconds the statements take (`float8`, so sub-millisecond
/// budgets are not rounded away).
fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn decode(err: serde_json::Error) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(err))
}
