//! [`CallRequest`]: any method, headers and body through a [`BudgetedClient`], and the
//! [`Reply`] it gives. [`CallRequest::send`] is the one path every call takes, so a
//! `POST` gets exactly the guarantees of a `GET`.
//!
//! A refused connection is retried once, whatever the method: it carried no byte of the
//! request. A 503 (refused before any work) is retried once, and a slow call may be
//! hedged, only for a request safe to send twice: `GET`, `HEAD`, or one marked
//! [`idempotent`](CallRequest::idempotent). Nothing else is retried, a 504 least of
//! all: the downstream may have acted, or the shared deadline has run out there.
//!
//! A write (any method but `GET` and `HEAD`, unless marked
//! [`read_only`](CallRequest::read_only)) is a point of no return once sent: the
//! downstream may act on it whatever happens to the answer. So at the deadline it is
//! not cut with a 504 ("nothing was written") but waited for a grace longer, to learn
//! its outcome from the downstream's own answer (bounded by the budget sent on); one
//! that does not come, or proves nothing, is [`CallErrorKind::OutcomeUnknown`].

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{BudgetedClient, CallError, CallErrorKind};
use crate::deadline::Deadline;
use crate::downstream::Downstream;
use crate::header::{PREVIOUS_ATTEMPTS_HEADER, REQUEST_TIMEOUT_HEADER};
use crate::mode::DEADLINE_MODE_HEADER;

/// The headers the client sets itself; a caller's values for them are dropped.
const OWNED_HEADERS: [HeaderName; 5] = [
    REQUEST_TIMEOUT_HEADER,
    PREVIOUS_ATTEMPTS_HEADER,
    DEADLINE_MODE_HEADER,
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
];

/// One request being built, made by [`BudgetedClient::request`]. A header or body that
/// cannot be used is reported by [`send`](CallRequest::send) as a
/// [`CallErrorKind::Request`], before any I/O, so the builder needs no `?` of its own.
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
    /// Marked as changing nothing (see [`read_only`](Self::read_only)).
    read_only: bool,
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
            read_only: false,
            invalid: None,
        }
    }

    /// Adds a header. The client owns `X-Request-Timeout-Ms`, `X-Deadline-Mode` and the
    /// trace context: values given here for them are dropped and the client's own sent,
    /// so no caller sends more budget than is left.
    pub fn header<K, V>(mut self, name: K, value: V) -> Self
    where
        K: TryInto<HeaderName>,
        V: TryInto<HeaderValue>,
    {
        match (name.try_into(), value.try_into()) {
            (Ok(name), Ok(_)) if OWNED_HEADERS.contains(&name) => {}
            (Ok(name), Ok(value)) => {
                self.headers.append(name, value);
            }
            _ => self.fail("a header name or value is not valid HTTP"),
        }
        self
    }

    /// The body, sent as given (set a `content-type` with [`header`](Self::header)).
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

    /// A health check: never refused by admission nor part of its estimate (it answers
    /// at once however slow the real calls are). The bulkhead and deadline still apply.
    pub fn health_check(mut self) -> Self {
        self.admission = false;
        self
    }

    /// Safe to send twice (the downstream keys it): it may be hedged and its 503
    /// retried, as a `GET` may. An `Idempotency-Key` header counts as marked.
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// Changes nothing downstream, whatever its method (a check or a query sent as
    /// `POST`): cut at the deadline it is a 504, as a `GET` is, instead of a write whose
    /// outcome must be learned. It is not sent twice unless also
    /// [`idempotent`](Self::idempotent).
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Whether the downstream may act on the request: the rule for writes applies.
    pub(super) fn writes(&self) -> bool {
        !(self.read_only || self.method == Method::GET || self.method == Method::HEAD)
    }

    /// Sends the request under `deadline`: the spent budget's 504, admission, a slot
    /// (`{name}_pool`), then the request and its whole body (`{name}`), all ending at the
    /// deadline. A 2xx is a [`Reply`]; anything else a [`CallError`].
    pub async fn send(self, deadline: &Deadline) -> Result<Reply, CallError> {
        if let Some(why) = &self.invalid {
            let cause = Unbuildable(why.clone());
            return Err(self.client.error(CallErrorKind::Request).caused_by(cause));
        }
        let client = self.client;
        client.refuse_spent(deadline)?;
        if self.admission {
            client.admit(deadline)?;
        }
        let slot = client.acquire_slot(deadline).await?;
        client.send_request(deadline, &self, slot).await
    }

    fn fail(&mut self, why: &str) {
        self.invalid.get_or_insert_with(|| why.to_owned());
    }
}

/// A downstream's 2xx answer, its body read in full.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The status, 200 to 299.
    pub status: StatusCode,
    /// The downstream's response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: bytes::Bytes,
    /// Who answered.
    pub(super) downstream: Downstream,
    /// The answer to a write: the downstream acted on it.
    pub(super) write: bool,
}

impl Reply {
    /// The body as JSON; one that does not parse is [`CallErrorKind::Invalid`] (502),
    /// or, answering a write, [`CallErrorKind::OutcomeUnknown`] (it was acted on).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, CallError> {
        let kind = match self.write {
            true => CallErrorKind::OutcomeUnknown,
            false => CallErrorKind::Invalid,
        };
        serde_json::from_slice(&self.body)
            .map_err(|err| CallError::new(self.downstream, kind).caused_by(err))
    }
}

/// Why a request could not be built, as the builder found it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unbuildable(String);
