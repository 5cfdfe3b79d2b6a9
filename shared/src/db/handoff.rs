//! The caller and its transaction's job: who answers, and who polls the job. The job
//! runs inside the caller's future while the caller waits, and moves to a task of its
//! own only if the caller stops polling it first: a task per transaction would wake
//! another worker on every order (docs/performance.md). Exactly one of the two answers:
//! the job when it knows in time, else the caller at its deadline. The job claims the
//! answer before COMMIT, so a COMMIT's outcome is always the job's to tell. The stop
//! has no waker: it is set only just before the job is polled again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, ready};

use tokio::time::Instant;
use tracing::Instrument as _;

use super::DbError;
use crate::deadline::Deadline;
use crate::stage::Stage;

/// What the caller and its job share, in one allocation.
#[derive(Debug)]
pub(super) struct Handoff<T> {
    answered: AtomicBool,
    /// When the job had its connection: the `db` stage began (unset: still `db_pool`).
    pub(super) connected_at: OnceLock<Instant>,
    answer: Mutex<Option<Result<T, DbError>>>,
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

    /// The job's answer (only the one that claimed it gives it), with the `db` stage's
    /// time written into the request's log and a deadline counted: the handler answers
    /// as soon as this arrives, while the job may still be cleaning up.
    pub(super) fn give(&self, deadline: &Deadline, result: Result<T, DbError>) {
        self.record_db(deadline);
        if let Err(DbError::Deadline(exceeded)) = &result {
            deadline.log().count_exceeded(exceeded.stage);
        }
        *self.answer.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
    }

    /// The stage a 504 at the deadline names: `db` once the job had its connection.
    fn stage(&self) -> Stage {
        match self.connected_at.get() {
            Some(_) => Stage::Db,
            None => Stage::DbPool,
        }
    }

    fn record_db(&self, deadline: &Deadline) {
        if let Some(started) = self.connected_at.get() {
            deadline.log().record(Stage::Db, started.elapsed());
        }
    }

    fn take_answer(&self) -> Option<Result<T, DbError>> {
        self.answer.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Tells the job that its deadline passed or nobody waits any more.
    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Ready once the caller has stopped, as the job is polled.
    pub(super) fn stopped(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|_| match self.is_stopped() {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
    }
}

/// Runs `job` inside this future until it answers. At the deadline, if it has not,
/// the caller answers 504 itself, naming the stage the job is in: the job may wait on
/// a server the network has cut off, and no COMMIT is on the wire. Once the job has
/// claimed the answer (a COMMIT is on its way), the caller waits for it.
pub(super) async fn answer<T>(
    job: impl Future<Output = ()> + Send + 'static,
    handoff: Arc<Handoff<T>>,
    deadline: &Deadline,
) -> Result<T, DbError> {
    let mut job = Detach {
        job: Some(Box::pin(job.in_current_span())),
        handoff: handoff.clone(),
    };
    tokio::select! {
        biased;
        result = answer_of(&mut job, &handoff) => return result,
        () = tokio::time::sleep_until(deadline.instant()) => {}
    }
    // This timer is the job's deadline too: it cancels its statement when next polled.
    handoff.stop();
    if handoff.claim() {
        handoff.record_db(deadline);
        return Err(deadline.exceeded(handoff.stage()).into());
    }
    answer_of(&mut job, &handoff).await
}

/// The job's answer, read right after each poll of the job (nothing waits on the
/// answer itself: a waker there would be this very task's, woken while it runs).
fn answer_of<'a, T>(
    job: &'a mut Detach<T>,
    handoff: &'a Handoff<T>,
) -> impl Future<Output = Result<T, DbError>> + 'a {
    std::future::poll_fn(move |cx| {
        let ended = Pin::new(&mut *job).poll(cx).is_ready();
        match handoff.take_answer() {
            Some(result) => Poll::Ready(result),
            None if !ended => Poll::Pending,
            // A job that ended without answering panicked.
            None => Poll::Ready(Err(DbError::Query(sqlx::Error::WorkerCrashed))),
        }
    })
}

/// A job polled by its caller, and handed to a task of its own if dropped before it
/// ends. Dropped, it first claims the answer (nobody is left to read one) and stops the
/// job, so the job reads the stop on its first poll there.
struct Detach<T> {
    job: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    handoff: Arc<Handoff<T>>,
}

impl<T> Future for Detach<T> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(job) = self.job.as_mut() else {
            return Poll::Ready(());
        };
        ready!(job.as_mut().poll(cx));
        self.job = None;
        Poll::Ready(())
    }
}

impl<T> Drop for Detach<T> {
    fn drop(&mut self) {
        self.handoff.claim();
        self.handoff.stop();
        let Some(job) = self.job.take() else { return };
        // A job that panicked is not polled again; outside a runtime there is nowhere to
        // finish it, and dropping it closes its connection.
        if std::thread::panicking() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn(job));
        }
    }
}
