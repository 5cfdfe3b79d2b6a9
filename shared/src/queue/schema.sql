-- The tables of deadline_propagation::queue (`queue::SCHEMA`). A job's deadline is on
-- the database's clock: the producer sends what is left, and the database adds it to
-- clock_timestamp(), so the hosts' clocks never enter.
CREATE TABLE queue_jobs (
    id          bigserial   PRIMARY KEY,
    -- Which workers take it: one table serves several queues.
    queue       text        NOT NULL,
    payload     jsonb       NOT NULL,
    state       text        NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'running', 'done', 'expired', 'failed')),
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- NULL: no deadline (legacy mode); the job runs whenever a worker reaches it.
    deadline_at timestamptz,
    -- Claims so far; the fence names the attempt, so a worker that lost its claim
    -- cannot finish the job.
    attempts    integer     NOT NULL DEFAULT 0,
    -- A running job whose lease has passed is taken as abandoned (its worker died).
    lease_until timestamptz,
    finished_at timestamptz,
    -- What the job's work returned, committed with its effect.
    result      jsonb
);

-- The jobs a worker may still take, in the order it takes them.
CREATE INDEX queue_jobs_open ON queue_jobs (queue, id) WHERE state IN ('queued', 'running');

-- One row per claim, written by the claim itself: when each attempt started on the
-- database's clock, and how it ended (NULL: its worker died).
CREATE TABLE queue_attempts (
    job_id     bigint      NOT NULL REFERENCES queue_jobs (id),
    attempt    integer     NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz,
    outcome    text        CHECK (outcome IN ('done', 'fenced', 'failed')),
    PRIMARY KEY (job_id, attempt)
);
