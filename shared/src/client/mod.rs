//! [`BudgetedClient`]: an HTTP client whose every call spends only the remaining budget,
//! in two stages named after its downstream ([`ClientConfig::name`]):
//! 1. `{name}_pool`: a slot in the bulkhead within `min(acquire_timeout, remaining)`: a
//!    full queue or a passed acquire timeout is a 503 before any work, the deadline a 504;
//! 2. `{name}`: connect, send, headers *and body* under what is left, the budget sent on
//!    as `X-Request-Timeout-Ms` less what this hop keeps back.
//!
//! Both end at the deadline: one timeout over pool wait, request and body, which a
//! per-request "response timeout" cannot give. A budget no larger than what is kept
//! back is spent: nothing is sent, and the call is a 504 at once. Read `request.rs`
//! next ([`CallRequest::send`], the one path every call takes), then `send.rs`,
//! `error.rs`, `bulkhead.rs` and `wire.rs`; the extras are [plugins](Plugin). In observe
//! mode a call waits as without the technique (no queue limit, a fixed
//! [`ClientConfig::timeout`]) and carries `X-Deadline-Mode: observe`.

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
pub use plugin::{Admit, Attempt, AttemptKind, AttemptOutcome, CallStart, Event, Plugin};
pub use request::{CallRequest, Reply};
use wire::Wire;
#[cfg(feature = "test-util")]
pub(crate) use {error::is_outcome_unknown, wire::server_total};

use crate::deadline::Deadline;
use crate::downstream::Downstream;
use crate::mode::DeadlineMode;

/// How a [`BudgetedClient`] is set up: the defaults, which fields may change.
///
/// ```
/// use std::time::Duration;
/// use deadline_propagation::client::{BudgetedClient, ClientConfig};
/// use deadline_propagation::Downstream;
///
/// let name = Downstream::new("inventory").expect("a valid downstream name");
/// let mut config = ClientConfig::new(name, "http://127.0.0.1:8082");
/// config.acquire_timeout = Duration::from_millis(40);
/// let client = BudgetedClient::new(config).expect("the client builds");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Which downstream: it names the metrics (`client="inventory"`) and the stages.
    pub name: Downstream,
    /// Base URL, e.g. `http://127.0.0.1:8081`.
    pub base_url: String,
    /// Calls in flight at most (50).
    pub max_connections: u32,
    /// Calls waiting for a slot at most (50); more are refused at once.
    pub pending_max: u32,
    /// The longest a call waits for a slot (40 ms): the early-rejection threshold.
    pub acquire_timeout: Duration,
    /// Budget kept back at this hop when propagating (5 ms), to answer in.
    pub reserve: Duration,
    /// How long an unused connection is kept (2 s): below the downstream's own idle
    /// close, so that a call never reuses a connection the server is closing.
    pub idle_timeout: Duration,
    /// The fixed timeout of a call in observe mode (30 s), as without the technique.
    pub timeout: Duration,
    /// The longest body read from the downstream, in bytes (1 MiB). What a downstream
    /// sends is input: a longer body is a 502, the rest is never read, and its
    /// connection is closed rather than reused.
    pub max_body: usize,
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
            max_body: 1 << 20,
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
        let bulkhead = Bulkhead::new(count(config.max_connections), count(config.pending_max));
        // No redirects: a 3xx is the downstream's answer; following it would send the
        // call elsewhere, where a refused connection would pass for a refused first one.
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

    /// The same client with `plugin` after the ones it has (before the first call).
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

    /// The downstream this client calls.
    pub fn downstream(&self) -> Downstream {
        self.config.name
    }

    /// A request of any `method` to `base_url + path` (percent-encoded where it carries
    /// user input), sent by [`CallRequest::send`].
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

    /// A slot of the bulkhead, waited for however long it takes: for calls to the same
    /// downstream made without this client (code without the technique beside it), so
    /// that they count against its connections and in its pool gauges.
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

    /// The round trip on the wire kept back from every budget sent (`wire.rs`).
    #[cfg(feature = "metrics")]
    pub(crate) fn wire(&self) -> Duration {
        self.wire.estimate()
    }

    /// What the plugins keep, for the metrics.
    #[cfg(feature = "metrics")]
    pub(crate) fn readings(&self) -> Vec<(&'static str, Duration)> {
        self.plugins.iter().flat_map(|p| p.readings()).collect()
    }

    fn emit(&self, event: Event) {
        for plugin in self.plugins.iter() {
            plugin.on_event(&event);
        }
    }

    /// Admission: whether the plugins let a call take a slot; refused in propagate as
    /// 503 `{name}`, only counted in observe.
    fn admit(&self, deadline: &Deadline) -> Result<(), CallError> {
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
            .map(|p| p.admit(&call))
            .find(|v| *v != Admit::Yes);
        match verdict {
            Some(Admit::Probe) => self.emit(Event::Probe),
            Some(Admit::Refuse { .. }) if !mode.enforces() => {
                deadline.would_refuse(self.config.name.call(), "predicted_late");
            }
            Some(Admit::Refuse { needed }) => {
                self.emit(Event::PredictedLate);
                let available = call.available;
                return Err(self.error(CallErrorKind::PredictedLate { needed, available }));
            }
            None | Some(Admit::Yes) => {}
        }
        Ok(())
    }

    /// What is kept back from every budget sent: the reserve and the wire.
    fn keep_back(&self) -> Duration {
        self.config.reserve + self.wire.estimate()
    }

    fn error(&self, kind: CallErrorKind) -> CallError {
        CallError::new(self.config.name, kind)
    }

    /// Whether nothing can be handed on: no call may be sent.
    fn is_spent(&self, deadline: &Deadline) -> bool {
        deadline.outbound_millis(self.keep_back()).is_none()
    }

    /// In propagate, a spent budget is a 504 `{name}` at once, before admission and
    /// the bulkhead: their 503 says "come back later", true only of a call that had time.
    fn refuse_spent(&self, deadline: &Deadline) -> Result<(), CallError> {
        if deadline.mode().enforces() && self.is_spent(deadline) {
            let exceeded = deadline.exceeded(self.config.name.call());
            return Err(self.error(CallErrorKind::Deadline(exceeded)));
        }
        Ok(())
    }

    /// Stage `{name}_pool`: a slot, or a refusal before any I/O.
    async fn acquire_slot(&self, deadline: &Deadline) -> Result<Slot, CallError> {
        let pool = self.config.name.pool();
        let started = Instant::now();
        let result = match deadline.mode() {
            DeadlineMode::Observe => {
                let (slot, over) = self.bulkhead.acquire_unbounded().await;
                let reason = if over {
                    Some("queue_full")
                } else if started.elapsed() > self.config.acquire_timeout {
                    Some("acquire_timeout")
                } else {
                    deadline.is_expired().then_some("deadline")
                };
                if let Some(reason) = reason {
                    deadline.would_refuse(pool, reason);
                }
                Ok(Ok(slot))
            }
            DeadlineMode::Propagate => {
                let wait = self.config.acquire_timeout;
                deadline.run(pool, self.bulkhead.acquire(wait)).await
            }
        };
        // Every wait is told, the refused ones too: they are the ones that matter.
        self.emit(Event::SlotWait(started.elapsed()));
        let (reason, kind) = match result {
            Ok(Ok(slot)) => return Ok(slot),
            Ok(Err(AcquireError::QueueFull)) => ("queue_full", CallErrorKind::QueueFull),
            Ok(Err(AcquireError::TimedOut)) => ("acquire_timeout", CallErrorKind::AcquireTimeout),
            Err(exceeded) => ("deadline", CallErrorKind::Deadline(exceeded)),
        };
        self.emit(Event::Refused(reason));
        Err(self.error(kind))
    }
}
