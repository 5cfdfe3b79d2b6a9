//! The point of no return: a COMMIT on the wire, after which an answer must say what
//! happened rather than "nothing was written".

use std::sync::Arc;
use std::time::Duration;

use super::Deadline;
use crate::timing::StageLog;

/// How long past its deadline a request that is past its point of no return may still
/// answer. The database step bounds its own wait for a COMMIT's outcome by less than this
/// (250 ms), so this is only the ingress layer's backstop.
pub const NO_RETURN_GRACE: Duration = Duration::from_millis(500);

/// See [`Deadline::point_of_no_return`]; the request is past it until this is dropped.
#[derive(Debug)]
#[must_use = "the point of no return ends when this guard is dropped"]
struct NoReturn {
    log: Arc<StageLog>,
}

impl Drop for NoReturn {
    fn drop(&mut self) {
        self.log.leave_no_return();
    }
}

impl Deadline {
    /// Marks the request as past a point of no return (a COMMIT on the wire) until the
    /// guard is dropped.
    ///
    /// Once a COMMIT is sent, the server may commit whatever the client does, so an
    /// answer at the deadline could no longer say "nothing was written" truthfully. While
    /// a guard lives, the ingress layer does not answer 504 at the deadline; it waits up
    /// to [`NO_RETURN_GRACE`] longer for the handler, which learns the outcome and
    /// answers by it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let deadline = deadline_propagation::Deadline::after(Duration::from_millis(300));
    /// let _committing = deadline.point_of_no_return(); // past it until this is dropped
    /// // ... send COMMIT, learn its outcome ...
    /// ```
    #[must_use = "the point of no return ends when this guard is dropped"]
    pub fn point_of_no_return(&self) -> impl std::fmt::Debug + Send + Sync + 'static {
        self.log.enter_no_return();
        NoReturn {
            log: Arc::clone(&self.log),
        }
    }
}
