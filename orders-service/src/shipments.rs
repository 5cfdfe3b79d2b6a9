//! `POST /api/orders/{id}/shipments` and `GET /api/shipments/{job}`: the queue hop.
//! The shipment is booked by shipping-worker from a job on the queue in this service's
//! database (`deadline_propagation::queue`); the job carries what is left of the
//! request's budget.
//!
//! Two ways to meet it, each with its promise:
//! - wait within the budget (the default): the shipment (201), or at the request's own
//!   time the job expired in one statement (504), after which it never takes effect,
//!   even when a worker holds it or claims it that instant;
//! - `Prefer: respond-async` (RFC 7240): 202 with `Location` of the job, whose state
//!   (queued, running, done, expired, failed) is the table's; an expired job never
//!   starts.
//!
//! Legacy mode enqueues without a deadline and waits with the fixed legacy timeout,
//! expiring nothing: its 504 promises nothing about the job.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use deadline_propagation::db::DbError;
use deadline_propagation::queue::{JobState, JobStatus, Queue, QueueConfig};
use deadline_propagation::{Deadline, DeadlineMode, Problem, Stage};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use utoipa::ToSchema;

use crate::budget::Budget;
use crate::legacy::LEGACY_TIMEOUT;
use crate::orders;
use crate::store::Store;

/// The stage of a 504 whose job expired on the queue.
const QUEUE: Stage = Stage::named("queue");

/// How long before the request's deadline the expire must have answered, so the
/// answer leaves before the ingress's own 504 could.
const EXPIRE_MARGIN: Duration = Duration::from_millis(15);

/// A shipment job, as its table says.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShipmentJob {
    /// The job's number (`/api/shipments/{job}`).
    pub job: i64,
    /// `queued`, `running`, `done`, `expired` or `failed`.
    #[schema(pattern = "^(queued|running|done|expired|failed)$")]
    pub state: String,
    /// The shipment booked (done only): `shipment_id`, `order_id`, `carrier`.
    #[schema(value_type = Option<Object>)]
    pub shipment: Option<Value>,
}

impl From<JobStatus> for ShipmentJob {
    fn from(status: JobStatus) -> Self {
        Self {
            job: status.id,
            state: status.state.as_str().to_owned(),
            shipment: status.result,
        }
    }
}

/// The queue's settings as this service uses them.
#[derive(Clone, Debug)]
pub struct Shipments {
    /// The queue, in this service's database.
    pub queue: Queue,
    /// Budget kept back from a job a caller waits for: the time to expire it and answer.
    pub reserve: Duration,
}

impl Shipments {
    /// The `shipments` queue on `db`, with the settings of `config`.
    pub fn from_config(config: &crate::Config, db: &deadline_propagation::db::Db) -> Self {
        let mut queue = QueueConfig::default();
        queue.min_useful = Duration::from_millis(config.queue_min_useful_ms);
        queue.poll = Duration::from_millis(config.queue_poll_ms);
        Self {
            queue: Queue::new(db.clone(), QUEUE_NAME, queue),
            reserve: Duration::from_millis(config.shipments_reserve_ms),
        }
    }
}

/// The queue shipping-worker takes shipments from.
pub const QUEUE_NAME: &str = "shipments";

/// Books a pickup for `order` (the path's text) through the queue: the answer, as
/// `POST /api/orders/{id}/shipments` gives it (`routes/shipments.rs`).
pub async fn create(
    shipments: &Shipments,
    store: Store<'_>,
    budget: Budget,
    order: &str,
    headers: &HeaderMap,
) -> Result<Response, Problem> {
    let not_found = || Problem::not_found(format!("no order {order:?}"));
    let order: i64 = order.parse().map_err(|_| not_found())?;
    if orders::find_order(store, &budget, order).await?.is_none() {
        return Err(not_found());
    }
    let respond_async = prefers_async(headers);
    let payload = json!({ "order_id": order });
    let queue = &shipments.queue;
    let deadline = match budget {
        Budget::Deadline(deadline) if deadline.mode() == DeadlineMode::Propagate => deadline,
        // Legacy and observe: no deadline on the job, nothing refused or expired.
        _ => {
            let deadline = Deadline::after(LEGACY_TIMEOUT);
            let job = queue.enqueue(&deadline, &payload, None).await?;
            if respond_async {
                return Ok(accepted(job));
            }
            return match queue.poll(&deadline, job, deadline.instant()).await {
                Some(status) => answer(status, &deadline),
                None => Err(Problem::deadline(deadline.exceeded(QUEUE))),
            };
        }
    };
    let reserve = if respond_async {
        Duration::ZERO
    } else {
        shipments.reserve
    };
    let by = deadline
        .instant()
        .checked_sub(reserve)
        .unwrap_or_else(Instant::now);
    // A job no worker would start is refused here, without being queued.
    if by.saturating_duration_since(Instant::now()) <= queue.config().min_useful {
        return Err(Problem::deadline(deadline.exceeded(QUEUE)));
    }
    let job = queue.enqueue(&deadline, &payload, Some(by)).await?;
    if respond_async {
        return Ok(accepted(job));
    }
    let expire_by = deadline.child(deadline.remaining().saturating_sub(EXPIRE_MARGIN));
    match queue.wait(&expire_by, job, by).await {
        Ok(status) => answer(status, &deadline),
        Err(DbError::OutcomeUnknown) => Ok(with_location(Problem::outcome_unknown(QUEUE), job)),
        Err(err) => Err(err.into()),
    }
}

/// The job `job` (the path's text) as its table says: `GET /api/shipments/{job}`.
pub async fn read(
    shipments: &Shipments,
    budget: Budget,
    job: &str,
) -> Result<Json<ShipmentJob>, Problem> {
    let not_found = || Problem::not_found(format!("no shipment job {job:?}"));
    let id: i64 = job.parse().map_err(|_| not_found())?;
    let deadline = match budget {
        Budget::Deadline(deadline) => deadline,
        Budget::Unbounded => Deadline::after(LEGACY_TIMEOUT),
    };
    let status = shipments.queue.status(&deadline, id).await?;
    status.map(|s| Json(s.into())).ok_or_else(not_found)
}

/// Whether the request asks to be answered before the work is done (RFC 7240).
fn prefers_async(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|preference| preference.trim().eq_ignore_ascii_case("respond-async"))
}

/// The answer for a job that is no longer open (or, legacy, at its timeout).
fn answer(status: JobStatus, deadline: &Deadline) -> Result<Response, Problem> {
    match status.state {
        JobState::Done => Ok(with_job(StatusCode::CREATED, status.into())),
        JobState::Expired => Err(Problem::deadline(deadline.exceeded(QUEUE))),
        JobState::Failed => Err(Problem::bad_gateway(
            QUEUE,
            "the booking failed on every attempt",
        )),
        // Legacy at its timeout: the job may still run, and this answer says nothing of it.
        JobState::Queued | JobState::Running => Ok(with_location(
            Problem::deadline(deadline.exceeded(QUEUE)),
            status.id,
        )),
    }
}

fn accepted(job: i64) -> Response {
    let body = ShipmentJob {
        job,
        state: JobState::Queued.as_str().to_owned(),
        shipment: None,
    };
    with_job(StatusCode::ACCEPTED, body)
}

fn with_job(status: StatusCode, body: ShipmentJob) -> Response {
    let job = body.job;
    let mut response = (status, Json(body)).into_response();
    set_location(&mut response, job);
    response
}

/// A problem that points at the job, where its fate can be learned.
fn with_location(problem: Problem, job: i64) -> Response {
    let mut response = problem.into_response();
    set_location(&mut response, job);
    response
}

fn set_location(response: &mut Response, job: i64) {
    response
        .headers_mut()
        .insert(header::LOCATION, location(job));
}

fn location(job: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("/api/shipments/{job}")).expect("digits are a valid header")
}

#[cfg(test)]
mod tests {
    /// The demo's migration carries the crate's queue tables as `queue::SCHEMA` gives
    /// them (a copier runs `SCHEMA` itself): the two copies cannot drift apart.
    #[test]
    fn the_migration_carries_the_crates_queue_schema_word_for_word() {
        let migration = include_str!("../migrations/20261207000001_queue_and_shipments.sql");
        let schema = deadline_propagation::queue::SCHEMA;
        let tables = &schema[schema
            .find("CREATE TABLE")
            .expect("the schema creates tables")..];
        assert!(
            migration.contains(tables.trim_end()),
            "the migration's queue tables differ from queue::SCHEMA"
        );
    }
}
