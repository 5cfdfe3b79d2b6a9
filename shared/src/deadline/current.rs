//! [`Deadline::current`] (feature `grpc`): the request's deadline as a task-local, for a
//! layer that is handed none, like a tonic client's.

use tokio::task::futures::TaskLocalFuture;

use super::Deadline;

tokio::task_local! {
    static CURRENT: Deadline;
}

impl Deadline {
    /// The deadline of the request this task serves: the ingress sets it around the
    /// handler. A task the handler spawns does not inherit it: hand that task the
    /// deadline (or run it in [`scope`](Deadline::scope)).
    pub fn current() -> Option<Deadline> {
        CURRENT.try_with(Deadline::clone).ok()
    }

    /// `future`, run with this deadline as [`Deadline::current`].
    pub fn scope<F: Future>(self, future: F) -> TaskLocalFuture<Deadline, F> {
        CURRENT.scope(self, future)
    }
}
