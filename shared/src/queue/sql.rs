//! The queue's statements. Durations are bound as milliseconds (`float8`); every
//! instant is the database's `clock_timestamp()`, the moment the statement reads it
//! (`now()` would be its transaction's start).

/// `$1` queue, `$2` payload (JSON text), `$3` milliseconds left (NULL: no deadline).
/// The notice to [`CHANNEL`](super::CHANNEL), the queue's name its payload, is sent
/// when the transaction commits, never for a job that did not.
pub(super) const ENQUEUE: &str = "\
WITH job AS (
    INSERT INTO queue_jobs (queue, payload, deadline_at)
    VALUES ($1, $2::jsonb, clock_timestamp() + $3::float8 * interval '1 millisecond')
    RETURNING id
)
SELECT job.id FROM job, pg_notify('queue_jobs', $1)";

/// `$1` queue, `$2` minimum useful milliseconds, `$3` lease milliseconds. The clock is
/// read once (`now`), so the start recorded is the very instant the deadline was
/// checked against. `SKIP LOCKED` passes over jobs other workers are taking; under READ
/// COMMITTED a row changed since the statement began (a caller's expire) is checked
/// again as it is now before it is locked.
pub(super) const CLAIM: &str = "\
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
next AS (
    SELECT j.id FROM queue_jobs j, now
    WHERE j.queue = $1
      AND (j.state = 'queued' OR (j.state = 'running' AND j.lease_until < now.t))
      AND (j.deadline_at IS NULL OR j.deadline_at > now.t + $2::float8 * interval '1 millisecond')
    ORDER BY j.id
    LIMIT 1
    FOR UPDATE OF j SKIP LOCKED
),
claimed AS (
    UPDATE queue_jobs j
    SET state = 'running', attempts = j.attempts + 1,
        lease_until = now.t + $3::float8 * interval '1 millisecond'
    FROM next, now
    WHERE j.id = next.id
    RETURNING j.id, j.attempts, j.payload, j.enqueued_at, j.deadline_at, now.t AS started_at
),
logged AS (
    INSERT INTO queue_attempts (job_id, attempt, started_at)
    SELECT id, attempts, started_at FROM claimed
)
SELECT id, attempts, payload::text,
       extract(epoch FROM started_at - enqueued_at)::float8,
       (extract(epoch FROM deadline_at - clock_timestamp()) * 1000)::float8
FROM claimed";

/// `$1` job, `$2` attempt, `$3` outcome: when and how an attempt ended.
pub(super) const END_ATTEMPT: &str = "\
UPDATE queue_attempts SET ended_at = clock_timestamp(), outcome = $3
WHERE job_id = $1 AND attempt = $2 AND outcome IS NULL";

/// `$1` job, `$2` attempt, `$3` result (JSON text): done only while this attempt holds
/// the job and its deadline is ahead.
pub(super) const FENCE: &str = "\
UPDATE queue_jobs SET state = 'done', finished_at = clock_timestamp(), result = $3::jsonb,
                      lease_until = NULL
WHERE id = $1 AND attempts = $2 AND state = 'running'
  AND (deadline_at IS NULL OR deadline_at > clock_timestamp())";

/// `$1` job, `$2` attempt: whether that attempt finished the job.
pub(super) const DONE: &str = "\
SELECT state = 'done' AND attempts = $2 FROM queue_jobs WHERE id = $1";

/// `$1` job, `$2` attempt, `$3` outcome, `$4` minimum useful milliseconds, `$5` most
/// attempts: an attempt that did not finish ends; its job is claimable again while it
/// has time, else expired, or failed after its last attempt.
pub(super) const RELEASE: &str = "\
WITH ended AS (
    UPDATE queue_attempts SET ended_at = clock_timestamp(), outcome = $3
    WHERE job_id = $1 AND attempt = $2 AND outcome IS NULL
),
next AS (
    SELECT id, CASE
        WHEN deadline_at <= clock_timestamp() + $4::float8 * interval '1 millisecond' THEN 'expired'
        WHEN attempts >= $5 THEN 'failed'
        ELSE 'queued' END AS state
    FROM queue_jobs
    WHERE id = $1 AND attempts = $2 AND state = 'running'
    FOR UPDATE
)
UPDATE queue_jobs j
SET state = next.state, lease_until = NULL,
    finished_at = CASE WHEN next.state = 'queued' THEN NULL ELSE clock_timestamp() END
FROM next
WHERE j.id = next.id";

/// `$1` queue, `$2` minimum useful milliseconds: the jobs no worker will start.
pub(super) const SWEEP: &str = "\
UPDATE queue_jobs SET state = 'expired', finished_at = clock_timestamp(), lease_until = NULL
WHERE queue = $1 AND state IN ('queued', 'running')
  AND deadline_at <= clock_timestamp() + $2::float8 * interval '1 millisecond'
  AND (state = 'queued' OR lease_until < clock_timestamp())";

/// `$1` job, `$2` queue: the caller's expire. Should a worker's fence hold the row, it
/// waits for that transaction's end and re-checks: done then, it changes nothing.
pub(super) const EXPIRE: &str = "\
UPDATE queue_jobs SET state = 'expired', finished_at = clock_timestamp(), lease_until = NULL
WHERE id = $1 AND queue = $2 AND state IN ('queued', 'running')";

/// `$1` job, `$2` queue: its state (a queued job past its deadline is expired), and its
/// result.
pub(super) const STATUS: &str = "\
SELECT CASE WHEN state = 'queued' AND deadline_at <= clock_timestamp() THEN 'expired'
            ELSE state END,
       result::text
FROM queue_jobs WHERE id = $1 AND queue = $2";

/// `$1` queue: how many jobs wait, and how long the oldest has (0 when none).
pub(super) const BACKLOG: &str = "\
SELECT count(*),
       coalesce(extract(epoch FROM clock_timestamp() - min(enqueued_at))::float8, 0)
FROM queue_jobs WHERE queue = $1 AND state = 'queued'";
