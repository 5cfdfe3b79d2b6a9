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
//! In [`DeadlineMode::Legacy`] the same client behaves like code written without the
//! technique: an unbounded queue, no budget header, and a fixed 30 s reqwest timeout
//! that covers the request but not the time spent queueing for a slot.

mod bulkhead;
mod error;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

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
    /// Propagate or legacy.
    pub mode: DeadlineMode,
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
        let pending_max = match config.mode {
            DeadlineMode::Propagate => Some(config.pending_max),
            DeadlineMode::Legacy => None,
        };
        let mut bulkhead = Bulkhead::new(config.max_connections, pending_max);
        if let Some(metrics) = &metrics {
            metrics.init(config.name);
            bulkhead = bulkhead.with_gauges(metrics.pool_gauges(config.name));
        }
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(config.max_connections)
            .pool_idle_timeout(config.idle_timeout)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            http,
            bulkhead: Arc::new(bulkhead),
            config: Arc::new(config),
            metrics,
        })
    }

    /// The bulkhead, for gauges and tests.
    pub fn bulkhead(&self) -> &Arc<Bulkhead> {
        &self.bulkhead
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
        let slot = self.acquire_slot(deadline).await?;
        let body = self.send(deadline, path).await;
        // The slot is held until the whole body has been read.
        drop(slot);
        body
    }

    /// Stage `catalog_pool`: a slot, or a refusal before any I/O.
    pub async fn acquire_slot(&self, deadline: &Deadline) -> Result<Slot, CallError> {
        let started = Instant::now();
        let result = match self.config.mode {
            DeadlineMode::Legacy => Ok(self.bulkhead.acquire(None).await),
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
    /// trace context (`traceparent`) of a client span injected.
    pub async fn send(&self, deadline: &Deadline, path: &str) -> Result<bytes::Bytes, CallError> {
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
        self.send_in(deadline, path, &span)
            .instrument(span.clone())
            .await
    }

    async fn send_in(
        &self,
        deadline: &Deadline,
        path: &str,
        span: &tracing::Span,
    ) -> Result<bytes::Bytes, CallError> {
        let mut headers = HeaderMap::new();
        crate::telemetry::propagation::inject(span, &mut headers);
        let started = Instant::now();
        let mut outcome = self.attempt(deadline, path, headers.clone()).await;
        // A refused connection sent nothing, so one retry is safe, and worth it only
        // if the budget still allows a real call. A 504 from the downstream is never
        // retried: the shared deadline has run out there, and a retry would only
        // spend what is left for nothing.
        let refused = matches!(&outcome, Ok(Err(err)) if err.is_connect());
        if refused
            && self.config.mode == DeadlineMode::Propagate
            && deadline.remaining() > MIN_RETRY_BUDGET
        {
            if let Some(metrics) = &self.metrics {
                metrics.count_retry(self.config.name);
            }
            outcome = self.attempt(deadline, path, headers).await;
        }
        let took = started.elapsed();
        if let Ok(Ok(answer)) = &outcome {
            span.record("http.response.status_code", answer.status.as_u16());
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
        match self.config.mode {
            DeadlineMode::Legacy => Ok(fetch(request.timeout(DeadlineMode::LEGACY_TIMEOUT)).await),
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
