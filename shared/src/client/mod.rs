//! [`BudgetedClient`]: an HTTP client whose every call spends only the remaining budget.
//!
//! A client is named by its configuration ([`ClientConfig::name`], a [`Downstream`]):
//! the name labels its metrics and gives its two stages, so its 504s, 503s and
//! `Server-Timing` name the service that was slow.
//!
//! One call is two stages under one deadline:
//! 1. `{name}_pool`: wait for a slot in the bulkhead for at most `min(acquire_timeout,
//!    remaining)`. A full queue or a passed acquire timeout is a 503 with `Retry-After`
//!    (refused before any work); the deadline passing while waiting is a 504.
//! 2. `{name}`: connect, send, headers *and body* under what is left, with the budget
//!    propagated as `X-Request-Timeout-Ms` less what this hop keeps back. A budget no
//!    larger than that is spent: nothing is sent, and the call is a 504 at once. When
//!    the deadline fires the future is dropped, which closes the connection.
//!
//! Both stages end at the same instant: together they are the one timeout over pool
//! wait, request and body that a per-request "response timeout" cannot give.
//!
//! Read it in this order: this file (the configuration, the spent budget and the
//! slot), `request.rs` (any method, headers and body; [`CallRequest::send`] is the
//! one path every call takes), `send.rs` (the attempts), `error.rs` (what each failure
//! answers), then `bulkhead.rs` and `wire.rs`. Admission, hedging, the retry budget and
//! the metrics are [plugins](Plugin), in modules of their own.
//!
//! Each call runs in the mode its [`Deadline`] carries. [`DeadlineMode::Observe`]
//! waits as code without the technique does (no queue limit, the fixed
//! [`ClientConfig::timeout`] over the request but not the slot wait), sends the budget
//! with `X-Deadline-Mode: observe` so that a downstream which honours it observes too,
//! and counts each refusal propagate would make.

mod bulkhead;
mod error;
mod plugin;
mod request;
mod send;
#[cfg(test)]
mod tests;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

pub use bulkhead::Slot;
use bulkhead::{AcquireError, Bulkhead};
pub use error::{CallError, CallErrorKind};
pub use plugin::{
    ATTEMPTS, Admit, Attempt, AttemptEnd, AttemptKind, AttemptOutcome, CallStart, Event, Plugin,
    Reading, Refusal,
};
pub use request::{CallRequest, Reply};
use wire::Wire;

use crate::deadline::Deadline;
use crate::mode::DeadlineMode;
use crate::stage::Downstream;

/// How a [`BudgetedClient`] is set up: a downstream's name and base URL, with defaults
/// for the rest that fields may change.
///
/// ```
/// use std::time::Duration;
/// use deadline_propagation::client::{BudgetedClient, ClientConfig};
/// use deadline_propagation::Downstream;
///
/// // From configuration; a bad name fails here, at start-up.
/// let name = Downstream::new("inventory").expect("a valid downstream name");
/// let mut config = ClientConfig::new(name, "http://127.0.0.1:8082");
/// config.max_connections = 20;
/// config.acquire_timeout = Duration::from_millis(40);
/// let client = BudgetedClient::new(config).expect("the client builds");
/// assert_eq!(client.downstream().pool().as_str(), "inventory_pool");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Which downstream this is: its name labels the metrics (`client="inventory"`)
    /// and its stages (`inventory_pool`, `inventory`).
    pub name: Downstream,
    /// Base URL, e.g. `http://127.0.0.1:8081`.
    pub base_url: String,
    /// Calls in flight at most (50; at least 1).
    pub max_connections: u32,
    /// Calls waiting for a slot at most (50); more are refused at once.
    pub pending_max: u32,
    /// The longest a call waits for a slot (40 ms): the early-rejection threshold.
    pub acquire_timeout: Duration,
    /// Budget kept back at this hop when propagating (5 ms): time to build its own
    /// answer from the downstream's.
    pub reserve: Duration,
    /// How long an unused connection is kept open (2 s). Keep it below the time after
    /// which the downstream closes idle connections, so that a call never reuses one
    /// the server is closing.
    pub idle_timeout: Duration,
    /// The fixed timeout of a call in observe mode, which enforces no budget (30 s):
    /// the bound a client without the technique has.
    pub timeout: Duration,
}

impl ClientConfig {
    /// The defaults, for the downstream `name` at `base_url`.
    pub fn new(name: Downstream, base_url: impl Into<String>) -> Self {
        Self {
            name,
            base_url: base_url.into(),
            max_connections: 50,
            pending_max: 50,
            acquire_timeout: Duration::from_millis(40),
            reserve: Duration::from_millis(5),
            idle_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The budgeted client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct BudgetedClient {
    http: reqwest::Client,
    bulkhead: Arc<Bulkhead>,
    /// The round trip on the wire, kept back from every budget sent.
    wire: Arc<Wire>,
    plugins: Arc<[Arc<dyn Plugin>]>,
    config: Arc<ClientConfig>,
}

impl BudgetedClient {
    /// Builds the client (at start-up: see [`Downstream`]).
    pub fn new(config: ClientConfig) -> Result<Self, reqwest::Error> {
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        // Observe ignores the queue limit per call (the mode can switch).
        let bulkhead = Bulkhead::new(
            count(config.max_connections),
            Some(count(config.pending_max)),
        );
        // No redirects: a 3xx is the downstream's answer. Following one would send the
        // call elsewhere, and a refused connection there would be retried as if nothing
        // had been sent.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(count(config.max_connections))
            .pool_idle_timeout(config.idle_timeout)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            http,
            bulkhead: Arc::new(bulkhead),
            wire: Arc::default(),
            plugins: Arc::new([]),
            config: Arc::new(config),
        })
    }

    /// The same client with `plugin` added after the ones it has (at start-up, before
    /// the first call).
    #[must_use]
    pub fn plugin(mut self, plugin: impl Plugin) -> Self {
        let mut plugins = self.plugins.to_vec();
        plugins.push(Arc::new(plugin));
        self.plugins = plugins.into();
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The downstream this client calls: its name and its two stages.
    pub fn downstream(&self) -> Downstream {
        self.config.name
    }

    /// A request of any `method` to `base_url + path` (percent-encoded where it carries
    /// user input), sent by [`CallRequest::send`] on the one path every call takes.
    ///
    /// ```no_run
    /// # async fn example(client: deadline_propagation::client::BudgetedClient, deadline: deadline_propagation::Deadline)
    /// # -> Result<(), deadline_propagation::client::CallError> {
    /// use http::Method;
    ///
    /// let reply = client
    ///     .request(Method::POST, "/reservations")
    ///     .header("idempotency-key", "order-17")
    ///     .json(&serde_json::json!({"sku": "SKU-00001", "quantity": 2}))
    ///     .send(&deadline)
    ///     .await?;
    /// assert!(reply.status.is_success());
    /// # Ok(()) }
    /// ```
    pub fn request(&self, method: Method, path: &str) -> CallRequest<'_> {
        CallRequest::new(self, method, path)
    }

    /// `GET base_url + path` and its JSON body, under `deadline`.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        deadline: &Deadline,
        path: &str,
    ) -> Result<T, CallError> {
        self.request(Method::GET, path).send(deadline).await?.json()
    }

    /// A slot of this client's bulkhead, waited for however long it takes: for calls
    /// to the same downstream that this client does not make itself (a code path
    /// without the technique beside it), so that they count against its connections
    /// and in its pool gauges. Held until dropped.
    pub async fn wait_for_slot(&self) -> Slot {
        self.bulkhead.acquire_unbounded().await.0
    }

    /// Calls waiting for a slot now.
    pub fn pending(&self) -> usize {
        self.bulkhead.pending()
    }

    /// Slots in use now.
    pub fn active(&self) -> usize {
        self.bulkhead.active()
    }

    /// The round trip on the wire kept back from every budget sent (see `wire.rs`).
    pub fn wire(&self) -> Duration {
        self.wire.estimate()
    }

    /// What the plugins know, for the metrics.
    pub fn readings(&self) -> Vec<Reading> {
        self.plugins.iter().flat_map(|p| p.readings()).collect()
    }

    /// Tells every plugin.
    fn emit(&self, event: Event) {
        for plugin in self.plugins.iter() {
            plugin.on_event(&event);
        }
    }

    /// Admission: asks the plugins whether a call may take a slot. Refused in
    /// propagate as 503 `{name}`; observe only counts it.
    fn admit(&self, deadline: &Deadline) -> Result<(), CallError> {
        if self.plugins.is_empty() {
            return Ok(());
        }
        let mode = deadline.mode();
        let call = CallStart {
            available: deadline.remaining().saturating_sub(self.config.reserve),
            active: self.bulkhead.active(),
            max_in_flight: self.bulkhead.max_in_flight(),
            pending: self.bulkhead.pending(),
            acquire_timeout: self.config.acquire_timeout,
            may_probe: mode.enforces(),
        };
        let verdict = self
            .plugins
            .iter()
            .map(|plugin| plugin.admit(&call))
            .find(|verdict| *verdict != Admit::Yes);
        match verdict {
            None | Some(Admit::Yes) => Ok(()),
            Some(Admit::Probe) => {
                self.emit(Event::Probe);
                Ok(())
            }
            Some(Admit::Refuse { .. }) if mode == DeadlineMode::Observe => {
                deadline.would_refuse(self.config.name.call(), "predicted_late");
                Ok(())
            }
            Some(Admit::Refuse { needed }) => {
                self.emit(Event::PredictedLate);
                let available = call.available;
                Err(self.error(CallErrorKind::PredictedLate { needed, available }))
            }
        }
    }

    /// What is kept back from every budget sent: this hop's reserve, and the round
    /// trip on the wire.
    fn keep_back(&self) -> Duration {
        self.config.reserve + self.wire.estimate()
    }

    /// An error of this client's downstream.
    fn error(&self, kind: CallErrorKind) -> CallError {
        CallError::new(self.config.name, kind)
    }

    /// Whether `deadline` has no more than [`keep_back`](Self::keep_back) left:
    /// nothing can be handed on, so no call may be sent.
    fn is_spent(&self, deadline: &Deadline) -> bool {
        deadline.outbound_millis(self.keep_back()).is_none()
    }

    /// In propagate, a spent budget is a 504 `{name}` at once, before admission and the
    /// bulkhead: their 503 says "come back later", true only of a call that still had
    /// time. Observe goes on; the send counts the 504 propagate would have answered.
    fn refuse_spent(&self, deadline: &Deadline) -> Result<(), CallError> {
        if deadline.mode().enforces() && self.is_spent(deadline) {
            let exceeded = deadline.exceeded(self.config.name.call());
            return Err(self.error(CallErrorKind::Deadline(exceeded)));
        }
        Ok(())
    }

    /// Stage `{name}_pool`: a slot, or a refusal before any I/O (503 `{name}_pool`, or
    /// 504 when the deadline passes while waiting).
    async fn acquire_slot(&self, deadline: &Deadline) -> Result<Slot, CallError> {
        let pool = self.config.name.pool();
        let started = Instant::now();
        let result = match deadline.mode() {
            DeadlineMode::Observe => {
                let (slot, over) = self.bulkhead.acquire_unbounded().await;
                let reason = if over {
                    Some(Refusal::QueueFull)
                } else if started.elapsed() > self.config.acquire_timeout {
                    Some(Refusal::AcquireTimeout)
                } else {
                    deadline.is_expired().then_some(Refusal::Deadline)
                };
                if let Some(reason) = reason {
                    deadline.would_refuse(pool, reason.as_str());
                }
                Ok(Ok(slot))
            }
            DeadlineMode::Propagate => {
                let wait = Some(self.config.acquire_timeout);
                deadline.run(pool, self.bulkhead.acquire(wait)).await
            }
        };
        // Every wait is told, the refused ones too: they are the ones that matter.
        self.emit(Event::SlotWait(started.elapsed()));
        let (refusal, kind) = match result {
            Ok(Ok(slot)) => return Ok(slot),
            Ok(Err(AcquireError::QueueFull)) => (Refusal::QueueFull, CallErrorKind::QueueFull),
            Ok(Err(AcquireError::TimedOut)) => {
                (Refusal::AcquireTimeout, CallErrorKind::AcquireTimeout)
            }
            Err(exceeded) => (Refusal::Deadline, CallErrorKind::Deadline(exceeded)),
        };
        self.emit(Event::Refused(refusal));
        Err(self.error(kind))
    }
}
