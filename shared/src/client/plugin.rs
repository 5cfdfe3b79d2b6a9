//! [`Plugin`]: what a [`BudgetedClient`](super::BudgetedClient) asks and tells the parts
//! a service may add to it.
//!
//! The client alone is the technique's chain: one deadline over the slot wait, the call
//! and its body, the budget sent on. The extras plug in here, each in a module of its
//! own that imports only the client: admission (`admission`), hedging (`hedging`), the
//! retry budget (`retry_budget`) and the metrics (`metrics`). A plugin answers the
//! client's questions at three points of a call (may it start, when does it get a
//! backup, may an extra attempt go out) and hears what happened. Every method has a
//! default that changes nothing, so a plugin implements only what it is about.

use std::fmt;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;

/// Something added to a client; see the [module](self). Plugins are asked in the order
/// they were added ([`BudgetedClient::plugin`](super::BudgetedClient::plugin)).
pub trait Plugin: Send + Sync + fmt::Debug + 'static {
    /// Before a call takes a slot: whether it may go out.
    fn admit(&self, call: &CallStart) -> Admit {
        let _ = call;
        Admit::Yes
    }

    /// How long the first attempt of a call safe to send twice runs before a backup is
    /// sent; the first plugin that knows decides.
    fn hedge_after(&self) -> Option<Duration> {
        None
    }

    /// What nine attempts in ten take: an extra attempt goes out only when what is left
    /// covers it. The first plugin that knows decides.
    fn likely_attempt(&self) -> Option<Duration> {
        None
    }

    /// `false` switches that rule off, to measure what it is worth.
    fn deadline_rule(&self) -> bool {
        true
    }

    /// Whether an extra attempt may go out; asked last, when the deadline and a slot
    /// allow it, so that a plugin may spend something on it.
    fn allow_extra(&self) -> bool {
        true
    }

    /// Something happened to a call.
    fn on_event(&self, event: &Event) {
        let _ = event;
    }

    /// What the plugin knows that the metrics show, read at each scrape.
    fn readings(&self) -> Vec<Reading> {
        Vec::new()
    }
}

/// A call about to take a slot, as admission sees it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CallStart {
    /// What the call has to spend: what is left less what the client keeps back.
    pub available: Duration,
    /// Slots in use.
    pub active: usize,
    /// Slots in all.
    pub max_in_flight: usize,
    /// Calls waiting for a slot.
    pub pending: usize,
    /// The longest a call waits for a slot.
    pub acquire_timeout: Duration,
    /// Whether a predicted-late call may go out anyway to learn (false in observe,
    /// which only asks what the answer would be).
    pub may_probe: bool,
}

/// What [`Plugin::admit`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Go.
    Yes,
    /// Predicted late, but sent to learn whether the downstream is quick again.
    Probe,
    /// Predicted late: `needed` is more than the call has (503 in propagate).
    Refuse {
        /// What the call would need, slot wait included.
        needed: Duration,
    },
}

/// What happened to a call, for the plugins that learn from it or count it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Event {
    /// A call's first attempt goes out.
    Call,
    /// A call waited this long for a slot (every wait, the refused ones too).
    SlotWait(Duration),
    /// The bulkhead refused a call.
    Refused(Refusal),
    /// A call predicted late was sent to learn.
    Probe,
    /// A call was refused as predicted late.
    PredictedLate,
    /// An attempt came back, or was dropped unfinished.
    Attempt(Attempt),
    /// What became of an attempt, or of one that was not sent.
    Counted(AttemptKind, AttemptOutcome),
    /// A call is retried.
    Retry,
}

/// Why the bulkhead refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The pending queue was full.
    QueueFull,
    /// The wait for a slot passed its limit.
    AcquireTimeout,
    /// The request's deadline ran out while waiting.
    Deadline,
}

impl Refusal {
    /// Every reason, as metric labels spell them.
    pub const ALL: [Refusal; 3] = [
        Refusal::QueueFull,
        Refusal::AcquireTimeout,
        Refusal::Deadline,
    ];

    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue_full",
            Refusal::AcquireTimeout => "acquire_timeout",
            Refusal::Deadline => "deadline",
        }
    }
}

/// One attempt, timed.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Attempt {
    /// When it was sent.
    pub started: Instant,
    /// How long it ran.
    pub took: Duration,
    /// How it ended.
    pub end: AttemptEnd,
    /// Cut then (by the deadline, a 504, a timeout, or dropped): it would have taken at
    /// least `took`.
    pub censored: bool,
    /// Whether a latency estimate learns from it (not from a health check).
    pub learns: bool,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The downstream answered this.
    Status(StatusCode),
    /// Cut by the deadline or the fixed timeout.
    Timeout,
    /// It could not be sent or read.
    Error,
    /// Dropped unfinished: its caller went away, or its hedge won.
    Cancelled,
}

impl AttemptEnd {
    /// As the `status` label spells it.
    pub fn label(self) -> String {
        match self {
            AttemptEnd::Status(status) => status.as_str().to_owned(),
            AttemptEnd::Timeout => "timeout".to_owned(),
            AttemptEnd::Error => "error".to_owned(),
            AttemptEnd::Cancelled => "cancelled".to_owned(),
        }
    }
}

/// Which attempt of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptKind {
    /// The call's first attempt.
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
    /// Sent; the call ended with another attempt's answer.
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

impl AttemptKind {
    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Hedge => "hedge",
            Self::Retry => "retry",
        }
    }
}

impl AttemptOutcome {
    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Won => "won",
            Self::Lost => "lost",
            Self::Cut => "cut",
            Self::RefusedBudget => "refused_budget",
            Self::RefusedDeadline => "refused_deadline",
            Self::NoSlot => "no_slot",
        }
    }
}

/// Every `(kind, outcome)` an attempt can have (a first attempt is always sent, a retry
/// never loses), for series that exist from the start.
pub const ATTEMPTS: [(AttemptKind, AttemptOutcome); 13] = {
    use AttemptKind::*;
    use AttemptOutcome::*;
    [
        (First, Won),
        (First, Lost),
        (First, Cut),
        (Hedge, Won),
        (Hedge, Lost),
        (Hedge, Cut),
        (Hedge, RefusedBudget),
        (Hedge, RefusedDeadline),
        (Hedge, NoSlot),
        (Retry, Won),
        (Retry, Cut),
        (Retry, RefusedBudget),
        (Retry, RefusedDeadline),
    ]
};

/// A figure a plugin keeps, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Reading {
    /// The call time admission decides on.
    LatencyEstimate(Duration),
    /// How long a first attempt runs before its hedge (zero: no hedge now).
    HedgeDelay(Duration),
}
