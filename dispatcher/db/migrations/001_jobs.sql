-- Jobs (durable intents), the outbox of ready jobs, and the registries the SQL door validates
-- against. The daemon keeps `queues` and `handlers` in step with its configuration at start.

CREATE TABLE dispatcher.queues (
    name            text PRIMARY KEY,
    max_attempts    integer NOT NULL CHECK (max_attempts >= 1),
    max_retry_age_s integer NOT NULL CHECK (max_retry_age_s >= 0)
);
INSERT INTO dispatcher.queues (name, max_attempts, max_retry_age_s) VALUES ('default', 10, 86400);

CREATE TABLE dispatcher.handlers (
    name            text PRIMARY KEY,
    kind            text NOT NULL CHECK (kind IN ('http', 'sql', 'python')),
    current_version integer NOT NULL DEFAULT 1 CHECK (current_version >= 1)
);
INSERT INTO dispatcher.handlers (name, kind) VALUES ('http', 'http');

CREATE TABLE dispatcher.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key              text NOT NULL UNIQUE CHECK (length(key) BETWEEN 1 AND 255),
    request_hash     text NOT NULL,
    queue            text NOT NULL,
    tenant           text NOT NULL DEFAULT '',
    handler          text NOT NULL,
    handler_version  integer NOT NULL DEFAULT 1,
    target           jsonb,
    payload          jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    state            text NOT NULL CHECK (state IN
                         ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled')),
    due_at           timestamptz NOT NULL,
    attempt          integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL CHECK (max_attempts >= 1),
    max_retry_age_s  integer NOT NULL CHECK (max_retry_age_s >= 0),
    -- Retry age is measured from here: the first due time, reset by an operator retry.
    budget_started_at timestamptz NOT NULL,
    lease_owner      text,
    lease_expires_at timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false,
    progress         jsonb,
    result           jsonb,
    last_error       text,
    dead_reason      text,
    run_key          text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    CHECK ((state = 'running') = (lease_owner IS NOT NULL))
);

-- The due-scan walks this index in due order; it only holds waiting intents.
CREATE INDEX jobs_scheduled_due ON dispatcher.jobs (due_at) WHERE state = 'scheduled';
-- The lease rescuer finds expired leases here.
CREATE INDEX jobs_running_lease ON dispatcher.jobs (lease_expires_at) WHERE state = 'running';
-- Operators list dead letters and terminal history per queue, newest first.
CREATE INDEX jobs_terminal ON dispatcher.jobs (state, queue, finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');
CREATE INDEX jobs_run_key ON dispatcher.jobs (run_key) WHERE run_key IS NOT NULL;

-- One row per delivery owed for a ready job; written in the same transaction as the transition
-- to `ready`, removed when a worker claims the job.
CREATE TABLE dispatcher.outbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint NOT NULL,
    queue      text NOT NULL,
    tenant     text NOT NULL,
    capability text NOT NULL,          -- handler:version, so a worker claims only what it runs
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_claim ON dispatcher.outbox (queue, tenant, id);

-- Function, view and trigger bodies live in db/functions/, one file each (db/schema.py applies
-- them after the migrations): dispatcher.request_hash, the idempotency fingerprint, was
-- created here.
