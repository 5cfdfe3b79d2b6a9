//! [`Plugin`]: what a [`BudgetedClient`](super::BudgetedClient) asks and tells the
//! extras a service adds to it: admission, hedging, the retry budget and the metrics,
//! each in a module of its own that imports only the client. Every method has a
//! default that changes nothing, so a plugin implements only what it is about.

use std::fmt;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

/// Something added to a client; plugins are asked in the order they were added
/// ([`BudgetedClient::plugin`](super::BudgetedClient::plugin)).
pub trait Plugin: Send + Sync + fmt::Debug + 'static {
    /// Before a call takes a slot: whether it may go out.
    fn admit(&self, call: &CallStart) -> Admit {
        let _ = call;
        Admit::Yes
    }

    /// How long the first attempt of a call safe to send twice runs before a backup.
    fn hedge_after(&self) -> Option<Duration> {
        None
    }

    /// What nine attempts in ten take: an extra attempt goes out only when what is left
    /// covers it (at least 20 ms). The first plugin that knows decides.
    fn likely_attempt(&self) -> Option<Duration> {
        None
    }

    /// `false` switches that rule off, only to measure what it is worth.
    fn deadline_rule(&self) -> bool {
        true
    }

    /// Whether an extra attempt may go out; asked last, so that it may spend a token.
    fn allow_extra(&self) -> bool {
        true
    }

    /// Something happened to a call.
    fn on_event(&self, event: &Event) {
        let _ = event;
    }

    /// The figures the plugin keeps, for the metrics: `(name, value)`.
    fn readings(&self) -> Vec<(&'static str, Duration)> {
        Vec::new()
    }
}

/// A call about to take a slot, as admission sees it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CallStart {
    /// What the call has to spend: what is left less this hop's reserve.
    pub available: Duration,
    /// Slots in use.
    pub active: usize,
    /// Slots in all.
    pub max_in_flight: usize,
    /// Calls waiting for a slot.
    pub pending: usize,
    /// The longest a call waits for a slot.
    pub acquire_timeout: Duration,
    /// Whether a call predicted late may still go out to learn (not in observe).
    pub may_probe: bool,
}

/// What [`Plugin::admit`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Go.
    Yes,
    /// Predicted late, but sent to learn whether the downstream is quick again.
    Probe,
    /// Predicted late: it would need `needed`, slot wait included (503 in propagate).
    Refuse {
        /// What the call would need.
        needed: Duration,
    },
}

/// What happened to a call.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Event {
    /// A call's first attempt goes out.
    Call,
    /// A call waited this long for a slot (every wait, the refused ones too).
    SlotWait(Duration),
    /// The bulkhead refused a call: `queue_full`, `acquire_timeout` or `deadline`.
    Refused(&'static str),
    /// A call predicted late went out as a probe.
    Probe,
    /// A call was refused as predicted late.
    PredictedLate,
    /// An attempt came back, or was dropped unfinished.
    Attempt(Attempt),
    /// What became of an attempt, or of one not sent.
    Counted(AttemptKind, AttemptOutcome),
    /// A call is retried.
    Retry,
}

/// One attempt, timed.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Attempt {
    /// When it was sent.
    pub started: Instant,
    /// How long it ran.
    pub took: Duration,
    /// The status it got; `None` when it was cut, failed, or was dropped unfinished.
    pub status: Option<StatusCode>,
    /// What the metrics label it when it has no status: `timeout`, `error`, `cancelled`.
    pub failure: &'static str,
    /// Cut then (the deadline, a 504, a timeout, dropped): it would have taken longer.
    pub censored: bool,
    /// Whether a latency estimate learns from it (not from a health check).
    pub learns: bool,
}

/// Which attempt of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptKind {
    /// The call's first.
    First,
    /// A backup beside a slow first attempt.
    Hedge,
    /// A second attempt after a refused connection or a 503.
    Retry,
}

/// What became of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Sent; the call ended with its answer.
    Won,
    /// Sent; the call ended with another's.
    Lost,
    /// Sent, and cut by the deadline or answered 504: its work was thrown away.
    Cut,
    /// Not sent: a plugin refused it (the retry budget had no token).
    RefusedBudget,
    /// Not sent: what was left could not cover what nine attempts in ten take.
    RefusedDeadline,
    /// Not sent (a hedge): no slot was free at once.
    NoSlot,
}
