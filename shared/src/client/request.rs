//! [`CallRequest`]: any method, headers and body through a [`BudgetedClient`], and the
//! [`Reply`] it gives.
//!
//! The builder only collects what to send. [`CallRequest::send`] runs the one path every
//! call of the client takes: admission, a bulkhead slot, then the request under what is
//! left of the deadline (send.rs), with the slot held until the whole body is read. So a
//! `POST` gets exactly the guarantees of a `GET`: one timeout over slot wait, send and
//! body, the budget header, the trace context, the same metrics and stage names.
//!
//! # Retries, hedges and non-idempotent methods
//!
//! A refused connection is retried once, whatever the method: a connection that was
//! refused carried no byte of the request, so the downstream cannot have acted on it,
//! and a retried `POST` cannot do the work twice. A 503 (refused before any work) is
//! retried once, and a slow call may be hedged, only for a request safe to send twice:
//! `GET`, `HEAD`, or one marked [`idempotent`](CallRequest::idempotent). Nothing else is
//! retried (a reset after sending, a timeout, any other status, least of all a 504): by
//! then the downstream may have acted, or the shared deadline has run out there. Every
//! extra attempt needs what is left to cover what nine attempts in ten take and a token of the
//! client's retry budget (`send.rs`).

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{BudgetedClient, CallError, CallErrorKind};
use crate::deadline::Deadline;
use crate::stage::Downstream;

/// One request being built; send it with [`send`](CallRequest::send). Made by
/// [`BudgetedClient::request`].
///
/// A header or body that cannot be used (an invalid header value, a value that does not
/// serialize) is reported by `send` as a [`CallErrorKind::Request`], before any I/O, so
/// a chain of builder calls needs no `?` of its own.
///
/// ```no_run
/// # async fn example(client: deadline_propagation::client::BudgetedClient, deadline: deadline_propagation::Deadline)
/// # -> Result<(), deadline_propagation::client::CallError> {
/// use http::Method;
///
/// let reply = client
///     .request(Method::PUT, "/stock/SKU-00001")
///     .header("content-type", "text/plain")
///     .body("17")
///     .send(&deadline)
///     .await?;
/// println!("{} {:?}", reply.status, reply.body);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a request does nothing until it is sent"]
pub struct CallRequest<'c> {
    client: &'c BudgetedClient,
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) headers: HeaderMap,
    pub(super) body: Option<bytes::Bytes>,
    /// False for a health check: not refused by admission, not part of its estimate.
    pub(super) admission: bool,
    /// Marked safe to send twice (see [`idempotent`](Self::idempotent)).
    pub(super) idempotent: bool,
    /// The first thing that made the request unsendable.
    invalid: Option<String>,
}

impl<'c> CallRequest<'c> {
    pub(super) fn new(client: &'c BudgetedClient, method: Method, path: &str) -> Self {
        Self {
            client,
            method,
            path: path.to_owned(),
            headers: HeaderMap::new(),
            body: None,
            admission: true,
            idempotent: false,
            invalid: None,
        }
    }

    /// Adds a header (kept alongside any earlier value of the same name).
    ///
    /// The client owns `X-Request-Timeout-Ms` (the remaining budget) and the trace
    /// context (`traceparent`, `tracestate`): values given here for them are replaced, so
    /// a caller can never send a budget larger than what is left.
    pub fn header<K, V>(mut self, name: K, value: V) -> Self
    where
        K: TryInto<HeaderName>,
        V: TryInto<HeaderValue>,
    {
        match (name.try_into(), value.try_into()) {
            (Ok(name), Ok(value)) => {
                self.headers.append(name, value);
            }
            _ => self.fail("a header name or value is not valid HTTP"),
        }
        self
    }

    /// The body, sent as given (set a `content-type` with [`header`](Self::header)).
    /// Bytes are cheap to clone, so the one retry after a refused connection sends the
    /// same body again without copying it.
    pub fn body(mut self, body: impl Into<bytes::Bytes>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// `value` as a JSON body, with `content-type: application/json`.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.headers
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                self.body = Some(body.into());
            }
            Err(err) => self.fail(&format!("the JSON body does not serialize: {err}")),
        }
        self
    }

    /// Marks the request as a health check: never refused by admission and not part of
    /// its latency estimate. A health endpoint answers at once however slow the real
    /// calls are; its times would tell admission the downstream is quick. The bulkhead
    /// and the deadline still apply.
    pub fn health_check(mut self) -> Self {
        self.admission = false;
        self
    }

    /// Marks the request as safe to send twice: the downstream does its work once
    /// however many copies arrive (it keys them, as an `Idempotency-Key` does). Such a
    /// request may be hedged and its 503 retried, as a `GET` may; a request that
    /// carries an `Idempotency-Key` header counts as marked.
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// Sends the request under `deadline`: admission, then a slot (stage
    /// `{name}_pool`), then the request and its whole body (stage `{name}`), all ending
    /// at the deadline. A 2xx is a [`Reply`]; any other answer or failure is a
    /// [`CallError`] (a 504 from the downstream is never retried).
    ///
    /// ```no_run
    /// # async fn example(client: deadline_propagation::client::BudgetedClient, deadline: deadline_propagation::Deadline)
    /// # -> Result<(), deadline_propagation::Problem> {
    /// let reply = client
    ///     .request(http::Method::POST, "/check")
    ///     .json(&serde_json::json!({"sku": "SKU-00001", "quantity": 1}))
    ///     .send(&deadline)
    ///     .await?; // a CallError is the answer it stands for: 504, 503, 502 or 404
    /// # Ok(()) }
    /// ```
    pub async fn send(self, deadline: &Deadline) -> Result<Reply, CallError> {
        if let Some(why) = &self.invalid {
            let cause = Unbuildable(why.clone());
            return Err(self.client.error(CallErrorKind::Request).caused_by(cause));
        }
        let client = self.client;
        // A spent budget is a 504 before anything could answer 503 (health checks too).
        client.refuse_spent(deadline)?;
        if self.admission {
            client.admit(deadline)?;
        }
        let slot = client.acquire_slot(deadline).await?;
        // The slot is held until the whole body has been read (and a hedge takes one
        // of its own).
        client.send_request(deadline, &self, slot).await
    }

    fn fail(&mut self, why: &str) {
        self.invalid.get_or_insert_with(|| why.to_owned());
    }
}

/// A downstream's successful (2xx) answer, body read in full: any other status is a
/// [`CallError`], so holding a `Reply` means the downstream said yes.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The status, 200 to 299.
    pub status: StatusCode,
    /// The downstream's response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: bytes::Bytes,
    /// Who answered (for the error a body that does not parse is).
    pub(super) downstream: Downstream,
}

impl Reply {
    /// The body parsed as JSON; a body that does not parse is a
    /// [`CallErrorKind::Invalid`] (502: the downstream broke its side of the
    /// interface), with serde's error as its source.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, CallError> {
        serde_json::from_slice(&self.body)
            .map_err(|err| CallError::new(self.downstream, CallErrorKind::Invalid).caused_by(err))
    }
}

/// Why a request could not be built, as the builder found it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unbuildable(String);
