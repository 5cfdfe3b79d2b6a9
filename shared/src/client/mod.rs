//! [`BudgetedClient`]: an HTTP client whose every call spends only the remaining budget.
//!
//! One call is two stages under one deadline:
//! 1. [`acquire_slot`](BudgetedClient::acquire_slot) (`catalog_pool`): wait for a slot in
//!    the [`Bulkhead`] for at most `min(acquire_timeout, remaining)`. A full queue or a
//!    passed acquire timeout is a 503 with `Retry-After` (refused before any work); the
//!    deadline passing while waiting is a 504.
//! 2. [`send`](BudgetedClient::send) (`catalog`): connect, send, headers *and body* under
//!    what is left, with the budget propagated as `X-Request-Timeout-Ms` minus the
//!    per-hop reserve. A budget no larger than the reserve is spent: nothing is sent and
//!    the call fails with 504 `catalog` at once. When the deadline fires the future is
//!    dropped, which closes the connection, and the downstream (if it watches its own
//!    deadline) stops too.
//!
//! Both stages end at the same instant, so together they are the one timeout over pool
//! wait + request + body that a per-request "response timeout" cannot give.
//!
//! Before either, [`Admission`] refuses a call that recent calls say cannot finish in
//! its remaining budget (503 `catalog`), so a doomed call never takes a slot.
//!
//! Each call runs in the mode its [`Deadline`] carries. In [`DeadlineMode::Legacy`] the
//! client behaves like code written without the technique: an unbounded queue, no
//! budget header, and a fixed 30 s reqwest timeout that covers the request but not the
//! time spent queueing for a slot. [`DeadlineMode::Observe`] waits and times out like
//! legacy but sends the budget header and counts each refusal propagate would make.

pub mod admission;
mod bulkhead;
mod error;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

pub use admission::{Admission, AdmissionMode, Verdict, expected_wait};
pub use bulkhead::{AcquireError, Bulkhead, Slot};
pub use error::{CallError, DEFAULT_RETRY_AFTER};

use crate::deadline::Deadline;
use crate::header::REQUEST_TIMEOUT_HEADER;
use crate::ingress::DeadlineMode;
use crate::metrics::{ClientMetrics, RejectReason};
use crate::stage::Stage;

/// The least budget worth a retry of a refused connection.
const MIN_RETRY_BUDGET: Duration = Duration::from_millis(20);

/// Why the client could not be built (reqwest's error, named so callers need not
/// depend on reqwest).
pub type BuildError = reqwest::Error;

/// How a [`BudgetedClient`] is set up.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Label for metrics (`client="catalog"`).
    pub name: &'static str,
    /// Base URL, e.g. `http://127.0.0.1:8081`.
    pub base_url: String,
    /// Calls in flight at most (`CATALOG_POOL_MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// Calls waiting for a slot at most (`CATALOG_POOL_PENDING_MAX`).
    pub pending_max: usize,
    /// The longest a call waits for a slot (`CATALOG_POOL_ACQUIRE_TIMEOUT_MS`); the
    /// early-rejection threshold.
    pub acquire_timeout: Duration,
    /// Budget kept back at this hop when propagating (`DEADLINE_RESERVE_MS`).
    pub reserve: Duration,
    /// Whether calls predicted to finish late are refused (`CATALOG_ADMISSION`).
    pub admission: AdmissionMode,
    /// How long an *unused* connection is kept open. Keep it well below the time after
    /// which the downstream closes idle connections (catalog-service: its header read
    /// timeout, 5 s). Otherwise a call can reuse a connection at the moment the server
    /// closes it: the request is lost unanswered and the call fails although the
    /// downstream is fine. Below it, the client always closes first.
    pub idle_timeout: Duration,
}

/// The budgeted client. Cheap to clone.
#[derive(Clone)]
pub struct BudgetedClient {
    http: reqwest::Client,
    bulkhead: Arc<Bulkhead>,
    admission: Option<Arc<Admission>>,
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
    /// Builds the client; `metrics` receives the pool gauges and call times.
    pub fn new(config: ClientConfig, metrics: Option<ClientMetrics>) -> Result<Self, BuildError> {
        // Legacy and observe ignore the queue limit per call (the mode can switch).
        let mut bulkhead = Bulkhead::new(config.max_connections, Some(config.pending_max));
        if let Some(metrics) = &metrics {
            metrics.init(config.name);
            bulkhead = bulkhead.with_gauges(metrics.pool_gauges(config.name));
        }
        let admission = (config.admission == AdmissionMode::Predict).then(|| {
            let gauge = metrics.as_ref().map(|m| m.estimate_gauge(config.name));
            Arc::new(Admission::new(gauge.unwrap_or_default()))
        });
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(config.max_connections)
            .pool_idle_timeout(config.idle_timeout)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            http,
            bulkhead: Arc::new(bulkhead),
            admission,
            config: Arc::new(config),
            metrics,
        })
    }

    /// The bulkhead, for gauges and tests.
    pub fn bulkhead(&self) -> &Arc<Bulkhead> {
        &self.bulkhead
    }

    /// The latency estimate, unless admission is off.
    pub fn admission(&self) -> Option<&Arc<Admission>> {
        self.admission.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// `GET base_url + path` and parse the JSON body, all under `deadline`.
    ///
    /// `path` must already be percent-encoded where it carries user input.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        deadline: &Deadline,
        path: &str,
    ) -> Result<T, CallError> {
        let body = self.get_bytes(deadline, path).await?;
        serde_json::from_slice(&body).map_err(|err| CallError::Invalid(err.to_string()))
    }

    /// `GET base_url + path`, the whole body, under `deadline`.
    pub async fn get_bytes(
        &self,
        deadline: &Deadline,
        path: &str,
    ) -> Result<bytes::Bytes, CallError> {
        self.admit(deadline)?;
        let slot = self.acquire_slot(deadline).await?;
        let body = self.send_sampled(deadline, path, true).await;
        // The slot is held until the whole body has been read.
        drop(slot);
        body
    }

    /// Like [`get_bytes`](Self::get_bytes), for a health check: never refused by
    /// admission and not part of the estimate. A health endpoint answers at once however
    /// slow the real calls are; its times would tell admission the downstream is quick.
    pub async fn get_health(
        &self,
        deadline: &Deadline,
        path: &str,
    ) -> Result<bytes::Bytes, CallError> {
        let slot = self.acquire_slot(deadline).await?;
        let body = self.send_sampled(deadline, path, false).await;
        drop(slot);
        body
    }

    /// Admission: refuses (503 in propagate; counted only in observe) a call that the
    /// recent latency says cannot finish in what it has left, before it takes a slot.
    pub fn admit(&self, deadline: &Deadline) -> Result<(), CallError> {
        let mode = deadline.mode();
        let Some(admission) = self
            .admission
            .as_ref()
            .filter(|_| mode != DeadlineMode::Legacy)
        else {
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
                    metrics.count_probe(self.config.name);
                }
                Ok(())
            }
            Verdict::Refuse { .. } if mode == DeadlineMode::Observe => {
                deadline.would_refuse(Stage::Catalog, "predicted_late");
                Ok(())
            }
            Verdict::Refuse { needed } => {
                if let Some(metrics) = &self.metrics {
                    metrics.count_predicted_late(self.config.name);
                }
                Err(CallError::PredictedLate { needed, available })
            }
        }
    }

    /// Stage `catalog_pool`: a slot, or a refusal before any I/O.
    pub async fn acquire_slot(&self, deadline: &Deadline) -> Result<Slot, CallError> {
        let started = Instant::now();
        let result = match deadline.mode() {
            DeadlineMode::Legacy => Ok(Ok(self.bulkhead.acquire_unbounded().await.0)),
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
                    deadline.would_refuse(Stage::CatalogPool, reason);
                }
                Ok(Ok(slot))
            }
            DeadlineMode::Propagate => {
                let wait = Some(self.config.acquire_timeout);
                deadline
                    .run(Stage::CatalogPool, self.bulkhead.acquire(wait))
                    .await
            }
        };
        // Every wait is recorded, the refused ones too: they are the ones that matter.
        if let Some(metrics) = &self.metrics {
            metrics.observe_acquire(self.config.name, started.elapsed());
        }
        let refused = |reason: RejectReason| {
            if let Some(metrics) = &self.metrics {
                metrics.count_rejection(self.config.name, reason);
            }
        };
        match result {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(err)) => {
                refused(match err {
                    AcquireError::QueueFull => RejectReason::QueueFull,
                    AcquireError::TimedOut => RejectReason::AcquireTimeout,
                });
                Err(CallError::Rejected {
                    reason: err,
                    retry_after: Duration::from_secs(1),
                })
            }
            Err(exceeded) => {
                refused(RejectReason::Deadline);
                Err(CallError::Deadline(exceeded))
            }
        }
    }

    /// Stage `catalog`: the request and its body, with the budget propagated and the
    /// trace context (`traceparent`) of a client span injected. Its time informs the
    /// admission estimate.
    pub async fn send(&self, deadline: &Deadline, path: &str) -> Result<bytes::Bytes, CallError> {
        self.send_sampled(deadline, path, true).await
    }

    async fn send_sampled(
        &self,
        deadline: &Deadline,
        path: &str,
        sampled: bool,
    ) -> Result<bytes::Bytes, CallError> {
        let span = tracing::info_span!(
            "http.client",
            otel.name = %format_args!("GET {}", self.config.name),
            otel.kind = "client",
            http.request.method = "GET",
            url.full = %format_args!("{}{path}", self.config.base_url),
            deadline.budget_ms = deadline.budget().as_millis() as u64,
            deadline.remaining_ms = deadline.remaining().as_millis() as u64,
            http.response.status_code = tracing::field::Empty,
        );
        self.send_in(deadline, path, &span, sampled)
            .instrument(span.clone())
            .await
    }

    async fn send_in(
        &self,
        deadline: &Deadline,
        path: &str,
        span: &tracing::Span,
        sampled: bool,
    ) -> Result<bytes::Bytes, CallError> {
        let mode = deadline.mode();
        let spent = deadline.outbound_millis(self.config.reserve).is_none();
        if spent && mode == DeadlineMode::Propagate {
            // Nothing is sent, so there is nothing to learn from either.
            return Err(CallError::Deadline(deadline.exceeded(Stage::Catalog)));
        }
        let mut headers = HeaderMap::new();
        crate::telemetry::propagation::inject(span, &mut headers);
        let started = Instant::now();
        let mut outcome = self.attempt(deadline, path, headers.clone()).await;
        // A refused connection sent nothing, so one retry is safe, and worth it only
        // if the budget still allows a real call. A 504 from the downstream is never
        // retried: the shared deadline has run out there, and a retry would only
        // spend what is left for nothing.
        let refused = matches!(&outcome, Ok(Err(err)) if err.is_connect());
        if refused && mode == DeadlineMode::Propagate && deadline.remaining() > MIN_RETRY_BUDGET {
            if let Some(metrics) = &self.metrics {
                metrics.count_retry(self.config.name);
            }
            outcome = self.attempt(deadline, path, headers).await;
        }
        let took = started.elapsed();
        if let Ok(Ok(answer)) = &outcome {
            span.record("http.response.status_code", answer.status.as_u16());
        }
        // Cut at our deadline, or the downstream ran out of the budget we gave it: the
        // call would have taken at least this long (a censored observation).
        let censored = match &outcome {
            Err(_) => true,
            Ok(Ok(answer)) => answer.status == http::StatusCode::GATEWAY_TIMEOUT,
            Ok(Err(err)) => err.is_timeout(),
        };
        if let Some(admission) = self.admission.as_ref().filter(|_| sampled) {
            admission.record(started, took, censored);
        }
        if mode == DeadlineMode::Observe && (spent || deadline.is_expired()) {
            deadline.would_refuse(Stage::Catalog, "deadline");
        }
        let (label, result) = match outcome {
            Err(exceeded) => ("timeout".to_owned(), Err(CallError::Deadline(exceeded))),
            Ok(Ok(answer)) => (
                answer.status.as_str().to_owned(),
                CallError::check(answer.status, &answer.headers, answer.body, deadline),
            ),
            Ok(Err(err)) if err.is_timeout() => (
                "timeout".to_owned(),
                Err(CallError::Unreachable(err.to_string())),
            ),
            Ok(Err(err)) => (
                "error".to_owned(),
                Err(CallError::Unreachable(err.to_string())),
            ),
        };
        if let Some(metrics) = &self.metrics {
            metrics.observe_request(self.config.name, &label, took);
        }
        result
    }

    /// One request, bounded as the mode says.
    async fn attempt(
        &self,
        deadline: &Deadline,
        path: &str,
        headers: HeaderMap,
    ) -> Result<Result<Answer, reqwest::Error>, crate::DeadlineExceeded> {
        let request = self
            .http
            .get(format!("{}{path}", self.config.base_url))
            .headers(headers);
        match deadline.mode() {
            DeadlineMode::Legacy => Ok(fetch(request.timeout(DeadlineMode::LEGACY_TIMEOUT)).await),
            // The budget goes downstream (unless spent), but nothing here enforces it.
            DeadlineMode::Observe => {
                let request = match deadline.outbound_millis(self.config.reserve) {
                    Some(budget) => request.header(REQUEST_TIMEOUT_HEADER, budget),
                    None => request,
                };
                Ok(fetch(request.timeout(DeadlineMode::LEGACY_TIMEOUT)).await)
            }
            DeadlineMode::Propagate => {
                // No more than the reserve left: the budget is spent, and no I/O starts.
                let Some(budget) = deadline.outbound_millis(self.config.reserve) else {
                    return Err(deadline.exceeded(Stage::Catalog));
                };
                let request = request.header(REQUEST_TIMEOUT_HEADER, budget);
                deadline.run(Stage::Catalog, fetch(request)).await
            }
        }
    }
}

/// A downstream's whole answer.
struct Answer {
    status: http::StatusCode,
    /// Kept for what is passed on (a 503's `Retry-After`).
    headers: HeaderMap,
    body: bytes::Bytes,
}

/// Sends and reads the whole body: both belong inside the same timeout.
async fn fetch(request: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}
