//! [`BudgetedClient`]: an HTTP client whose every call spends only the remaining budget.
//!
//! A client is named by its configuration ([`ClientConfig::name`], a [`Downstream`]):
//! `catalog`, `inventory`, `payment`. The name labels its metrics (`client="inventory"`)
//! and gives its two stages, so a second downstream needs no code change here and its
//! 504s, 503s and `Server-Timing` name the service that was slow.
//!
//! One call is two stages under one deadline:
//! 1. `acquire_slot` (`{name}_pool`): wait for a slot in
//!    the bulkhead for at most `min(acquire_timeout, remaining)`. A full queue or a
//!    passed acquire timeout is a 503 with `Retry-After` (refused before any work); the
//!    deadline passing while waiting is a 504.
//! 2. the request (`{name}`): connect, send, headers *and body* under what is left, with
//!    the budget propagated as `X-Request-Timeout-Ms` minus the per-hop reserve. A budget
//!    no larger than the reserve is spent: nothing is sent and the call fails with 504
//!    `{name}` at once. When the deadline fires the future is dropped, which closes the
//!    connection, and the downstream (if it watches its own deadline) stops too.
//!
//! Both stages end at the same instant, so together they are the one timeout over pool
//! wait + request + body that a per-request "response timeout" cannot give.
//!
//! Before either, admission refuses a call that recent calls say cannot finish in
//! its remaining budget (503 `{name}`), so a doomed call never takes a slot.
//!
//! Any method, headers and body go through [`BudgetedClient::request`] (a
//! [`CallRequest`] builder, `request.rs`); [`get_json`](BudgetedClient::get_json),
//! [`get_bytes`](BudgetedClient::get_bytes) and [`get_health`](BudgetedClient::get_health)
//! are shorthands for it. The sending itself (budget header, trace context, the one
//! retry, metrics) is `send.rs`.
//!
//! Each call runs in the mode its [`Deadline`] carries. [`DeadlineMode::Observe`]
//! waits as code without the technique does (no queue limit, the fixed
//! [`ClientConfig::timeout`] over the request but not the wait for a slot), sends the
//! budget header with `X-Deadline-Mode: observe` so that a downstream which honours it
//! observes too, and counts each refusal propagate would make.

mod admission;
mod bulkhead;
mod error;
mod hedge;
mod request;
mod retry_budget;
mod send;
#[cfg(test)]
mod tests;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

pub(crate) use admission::PROBE_INTERVAL;
use admission::{Admission, Verdict, expected_wait};
pub use bulkhead::Slot;
use bulkhead::{AcquireError, Bulkhead};
pub use error::{CallError, CallErrorKind};
pub use hedge::HedgePolicy;
use hedge::History;
pub use request::{CallRequest, Reply};
pub use retry_budget::RetryBudget;
use retry_budget::Tokens;
use wire::Wire;

use crate::deadline::Deadline;
use crate::metrics::ClientMetrics;
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
    /// and its stages (`inventory_pool`, `inventory`) name where a call's budget went.
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
    /// Whether calls that recent calls say cannot finish in what they have left are
    /// refused before they take a slot (on).
    pub admission: bool,
    /// How long an *unused* connection is kept open (2 s). Keep it well below the time
    /// after which the downstream closes idle connections. Otherwise a call can reuse a
    /// connection at the moment the server closes it: the request is lost unanswered and
    /// the call fails although the downstream is fine. Below it, the client always
    /// closes first.
    pub idle_timeout: Duration,
    /// Hedging: a backup attempt for a slow call that is safe to send twice. `None`
    /// (the default) sends none.
    pub hedge: Option<HedgePolicy>,
    /// How many extra attempts (hedges and retries) the client may add to its first
    /// ones.
    pub retry_budget: RetryBudget,
    /// The fixed timeout of a call in observe mode, where no budget is enforced (30 s):
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
            admission: true,
            idle_timeout: Duration::from_secs(2),
            hedge: None,
            retry_budget: RetryBudget::default(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The budgeted client. Cheap to clone.
#[derive(Clone)]
pub struct BudgetedClient {
    http: reqwest::Client,
    bulkhead: Arc<Bulkhead>,
    admission: Option<Arc<Admission>>,
    /// The round trip on the wire, kept back from every budget sent.
    wire: Arc<Wire>,
    /// The call times a hedge is timed from; `None` when the client does not hedge.
    history: Option<Arc<History>>,
    /// The tokens extra attempts spend.
    tokens: Arc<Tokens>,
    config: Arc<ClientConfig>,
    metrics: Option<ClientMetrics>,
}

impl std::fmt::Debug for BudgetedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetedClient")
            .field("config", &self.config)
            .field("bulkhead", &self.bulkhead)
            .finish_non_exhaustive()
    }
}

impl BudgetedClient {
    /// Builds the client; `metrics` receives the pool gauges and call times, and gets
    /// the series of this downstream's name and stages at once (at 0), so they are
    /// there from the first scrape. Build clients at start-up: see [`Downstream`].
    /// (An example is on [`ClientConfig`].)
    pub fn new(config: ClientConfig) -> Result<Self, reqwest::Error> {
        Self::build(config, None)
    }

    /// [`BudgetedClient::new`], reporting to `metrics`: its calls, its bulkhead's
    /// pending and active gauges (pool queueing against a slow downstream), its
    /// rejections, its latency estimate, its attempts, and its configured limits.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn with_metrics(
        config: ClientConfig,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Self, reqwest::Error> {
        let limits = crate::metrics::PoolLimits {
            max_connections: config.max_connections,
            pending_max: config.pending_max,
            acquire_timeout: config.acquire_timeout,
        };
        let settings = metrics.settings();
        settings.set_pool_limits(config.name.name(), limits);
        settings.set_policy_kind("reserve", config.reserve);
        Self::build(config, Some(metrics.client().clone()))
    }

    fn build(config: ClientConfig, metrics: Option<ClientMetrics>) -> Result<Self, reqwest::Error> {
        let name = config.name.name();
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        // Observe ignores the queue limit per call (the mode can switch).
        let mut bulkhead = Bulkhead::new(
            count(config.max_connections),
            Some(count(config.pending_max)),
        );
        if let Some(metrics) = &metrics {
            metrics.init(config.name, &RejectReason::ALL, &send::ATTEMPT_LABELS);
            bulkhead = bulkhead.with_gauges(metrics.pool_gauges(name));
        }
        let admission = config.admission.then(|| {
            let gauge = metrics.as_ref().map(|m| m.estimate_gauge(name));
            Arc::new(Admission::new(gauge.unwrap_or_default()))
        });
        let wire = Wire::new(
            metrics
                .as_ref()
                .map(|m| m.wire_gauge(name))
                .unwrap_or_default(),
        );
        let history = config.hedge.map(|policy| {
            let gauge = metrics.as_ref().map(|m| m.hedge_delay_gauge(name));
            Arc::new(History::new(policy, gauge.unwrap_or_default()))
        });
        let tokens = Arc::new(Tokens::new(config.retry_budget));
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
            admission,
            wire: Arc::new(wire),
            history,
            tokens,
            config: Arc::new(config),
            metrics,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The downstream this client calls: its name and its two stages.
    pub fn downstream(&self) -> Downstream {
        self.config.name
    }

    /// A request of any `method` to `base_url + path`, sent by [`CallRequest::send`]
    /// under one deadline with the same admission, bulkhead, budget header, trace
    /// context, retry rule and metrics as every other call of this client.
    ///
    /// `path` must already be percent-encoded where it carries user input.
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

    /// `GET base_url + path` and parse the JSON body, all under `deadline`: a
    /// shorthand for [`request`](Self::request) with `GET` and [`Reply::json`].
    ///
    /// `path` must already be percent-encoded where it carries user input.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        deadline: &Deadline,
        path: &str,
    ) -> Result<T, CallError> {
        self.request(Method::GET, path).send(deadline).await?.json()
    }

    /// `GET base_url + path`, the whole body, under `deadline`.
    pub async fn get_bytes(
        &self,
        deadline: &Deadline,
        path: &str,
    ) -> Result<bytes::Bytes, CallError> {
        let reply = self.request(Method::GET, path).send(deadline).await?;
        Ok(reply.body)
    }

    /// Like [`get_bytes`](Self::get_bytes), for a health check: never refused by
    /// admission and not part of the estimate (see [`CallRequest::health_check`]).
    pub async fn get_health(
        &self,
        deadline: &Deadline,
        path: &str,
    ) -> Result<bytes::Bytes, CallError> {
        let request = self.request(Method::GET, path).health_check();
        Ok(request.send(deadline).await?.body)
    }

    /// A slot of this client's bulkhead, waited for however long it takes: no queue
    /// limit, no timeout. For calls to the same downstream that this client does not
    /// make itself (a code path without the technique beside it), so that they count
    /// against its connections and show in its pool gauges. Held until dropped.
    pub async fn wait_for_slot(&self) -> Slot {
        self.bulkhead.acquire_unbounded().await.0
    }

    /// Admission: refuses (503 `{name}` in propagate; counted only in observe) a call
    /// that the recent latency says cannot finish in what it has left, before it takes
    /// a slot. A call whose budget is already spent is not predicted but refused as
    /// spent: 504 `{name}` in propagate. [`CallRequest::send`] calls it first.
    pub(crate) fn admit(&self, deadline: &Deadline) -> Result<(), CallError> {
        let mode = deadline.mode();
        if self.is_spent(deadline) {
            // Nothing to predict: the call cannot be sent at all.
            return self.refuse_spent(deadline);
        }
        let Some(admission) = self.admission.as_ref() else {
            return Ok(());
        };
        let bulkhead = &self.bulkhead;
        let wait = expected_wait(
            bulkhead.active(),
            bulkhead.max_in_flight(),
            bulkhead.pending(),
            admission.estimate(),
            self.config.acquire_timeout,
        );
        let available = deadline.remaining().saturating_sub(self.config.reserve);
        match admission.check(available, wait, mode.enforces()) {
            Verdict::Admit => Ok(()),
            Verdict::Probe => {
                if let Some(metrics) = &self.metrics {
                    metrics.count_probe(self.config.name.name());
                }
                Ok(())
            }
            Verdict::Refuse { .. } if mode == DeadlineMode::Observe => {
                deadline.would_refuse(self.config.name.call(), "predicted_late");
                Ok(())
            }
            Verdict::Refuse { needed } => {
                if let Some(metrics) = &self.metrics {
                    metrics.count_predicted_late(self.config.name.name());
                }
                Err(self.error(CallErrorKind::PredictedLate { needed, available }))
            }
        }
    }

    /// What is kept back from every budget sent: this hop's reserve, and the round
    /// trip on the wire (see `wire.rs`).
    pub(crate) fn keep_back(&self) -> Duration {
        self.config.reserve + self.wire.estimate()
    }

    /// An error of this client's downstream.
    pub(crate) fn error(&self, kind: CallErrorKind) -> CallError {
        CallError::new(self.config.name, kind)
    }

    /// Whether `deadline` has no more than [`keep_back`](Self::keep_back) left:
    /// nothing can be handed on, so no call may be sent.
    fn is_spent(&self, deadline: &Deadline) -> bool {
        deadline.outbound_millis(self.keep_back()).is_none()
    }

    /// In propagate, a spent budget is a 504 `{name}` at once. It comes before
    /// admission and the bulkhead because their 503 carries `Retry-After`, "come back
    /// later", which is true only of a call that still had time. Observe goes on; the
    /// send counts the 504 propagate would have answered.
    pub(crate) fn refuse_spent(&self, deadline: &Deadline) -> Result<(), CallError> {
        if self.is_spent(deadline) && deadline.mode().enforces() {
            let exceeded = deadline.exceeded(self.config.name.call());
            return Err(self.error(CallErrorKind::Deadline(exceeded)));
        }
        Ok(())
    }

    /// Stage `{name}_pool`: a slot, or a refusal before any I/O (503 `{name}_pool`,
    /// or 504 when the deadline passes while waiting). [`CallRequest::send`] calls it;
    /// call it yourself only to hold a slot across something that is not a request.
    pub(crate) async fn acquire_slot(&self, deadline: &Deadline) -> Result<Slot, CallError> {
        let (name, pool) = (self.config.name.name(), self.config.name.pool());
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
                let wait = Some(self.config.acquire_timeout);
                deadline.run(pool, self.bulkhead.acquire(wait)).await
            }
        };
        // Every wait is recorded, the refused ones too: they are the ones that matter.
        if let Some(metrics) = &self.metrics {
            metrics.observe_acquire(name, started.elapsed());
        }
        let refused = |reason: RejectReason| {
            if let Some(metrics) = &self.metrics {
                metrics.count_rejection(name, reason.as_str());
            }
        };
        match result {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(AcquireError::QueueFull)) => {
                refused(RejectReason::QueueFull);
                Err(self.error(CallErrorKind::QueueFull))
            }
            Ok(Err(AcquireError::TimedOut)) => {
                refused(RejectReason::AcquireTimeout);
                Err(self.error(CallErrorKind::AcquireTimeout))
            }
            Err(exceeded) => {
                refused(RejectReason::Deadline);
                Err(self.error(CallErrorKind::Deadline(exceeded)))
            }
        }
    }
}

/// Why the bulkhead refused a call (`http_client_pool_rejections_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RejectReason {
    /// The pending queue was at its maximum.
    QueueFull,
    /// The wait for a slot passed the acquire timeout.
    AcquireTimeout,
    /// The request's own deadline ran out while waiting.
    Deadline,
}

impl RejectReason {
    /// Every reason, as the label spells it: their series exist from the start.
    const ALL: [&'static str; 3] = ["queue_full", "acquire_timeout", "deadline"];

    fn as_str(self) -> &'static str {
        match self {
            RejectReason::QueueFull => "queue_full",
            RejectReason::AcquireTimeout => "acquire_timeout",
            RejectReason::Deadline => "deadline",
        }
    }
}
