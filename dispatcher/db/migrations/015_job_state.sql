-- A job's mutable state apart from its immutable intent.
--
-- Before: one wide row per job, rewritten at every transition (ready -> running -> succeeded).
-- No update could be HOT (`state` is in the partial indexes' predicates), so each rewrite copied
-- payload and target and inserted into every index of the table: primary key, key, handler, due
-- time, plus the partial index of the new state, 5 to 6 entries per transition.
--
-- Now:
--   dispatcher.intents    what was asked (key, fingerprint, handler, target, payload, limits):
--                         written once at intake, never updated by the engine
--   dispatcher.job_state  where the job is (state, due time, attempt, lease, outcome): a narrow
--                         row whose transitions insert into its primary key, the (due_at, id)
--                         listing index and the one partial index of the new state
--   dispatcher.jobs       a view joining the two, with the columns and order the table had, so
--                         every reader (API, console, operators, the SQL they write) is unchanged
--
-- The engine's statements write the two tables directly (db/queries.sql). Writes through the
-- view go through an INSTEAD OF trigger (db/functions/30_jobs_view_write.sql) for everything else: operator actions, scripts,
-- tests. `queue` and `run_key` are immutable and copied into job_state, so the state indexes
-- that need them (in-flight per queue, retention per queue, unfinished cron units) live there.
--
-- The state row also carries copies of `tenant` and `capability` (handler:version), so the
-- in-process claim takes ready jobs straight from it, fairly by tenant (jobs_ready_claim), and
-- the outbox is written only while a relay transport reads it (dispatcher.ready_outbox()).
--
-- Upgrade cost: the old table is renamed in place (its rows become the intents, its mutable
-- columns dropped: no rewrite); the state rows are copied once, then indexed. Both happen in
-- this migration's transaction, which blocks intake and the engine for its length: measured
-- in the README ("Upgrading to migration 015").

-- What hangs on the old table's columns. IF EXISTS: a database created by a release with the
-- function files never had them here (db/functions/ creates both once the tables are final).
DROP TRIGGER IF EXISTS jobs_dead_letter_notice ON dispatcher.jobs;
DROP VIEW IF EXISTS dispatcher.run_receipts;

ALTER TABLE dispatcher.jobs RENAME TO intents;

CREATE TABLE dispatcher.job_state (
    id                bigint PRIMARY KEY,
    queue             text NOT NULL,
    run_key           text,
    tenant            text NOT NULL DEFAULT '',
    capability        text NOT NULL,           -- handler:version, so a worker claims what it runs
    state             text NOT NULL,
    due_at            timestamptz NOT NULL,
    attempt           integer NOT NULL DEFAULT 0,
    budget_started_at timestamptz NOT NULL,
    lease_owner       text,
    lease_expires_at  timestamptz,
    cancel_requested  boolean NOT NULL DEFAULT false,
    progress          jsonb,
    result            jsonb,
    last_error        text,
    dead_reason       text,
    started_at        timestamptz,
    finished_at       timestamptz
) WITH (
    -- all churn happens here; see migration 004 for why vacuum comes early
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);

INSERT INTO dispatcher.job_state
SELECT id, queue, run_key, tenant, handler || ':' || handler_version, state, due_at, attempt,
       budget_started_at, lease_owner,
       lease_expires_at, cancel_requested, progress, result, last_error, dead_reason, started_at,
       finished_at
  FROM dispatcher.intents;

-- Dropping the columns drops their indexes and checks with them, and rewrites nothing.
DROP INDEX IF EXISTS dispatcher.jobs_run_key_id;
DROP INDEX IF EXISTS dispatcher.jobs_run_key;
ALTER TABLE dispatcher.intents
    DROP COLUMN state, DROP COLUMN due_at, DROP COLUMN attempt, DROP COLUMN budget_started_at,
    DROP COLUMN lease_owner, DROP COLUMN lease_expires_at, DROP COLUMN cancel_requested,
    DROP COLUMN progress, DROP COLUMN result, DROP COLUMN last_error, DROP COLUMN dead_reason,
    DROP COLUMN started_at, DROP COLUMN finished_at;
-- nothing in an intent changes after intake: no vacuum churn, the defaults are right
ALTER TABLE dispatcher.intents RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
                                      autovacuum_analyze_scale_factor);

-- NOT VALID as the originals were (migration 006 retired what it could; a database may still
-- hold rows stored before it): enforced for every write from now on.
ALTER TABLE dispatcher.job_state
    ADD CONSTRAINT job_state_state_check CHECK (state IN
        ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled', 'discarded'))
        NOT VALID,
    ADD CONSTRAINT job_state_lease_check CHECK ((state = 'running') = (lease_owner IS NOT NULL))
        NOT VALID,
    ADD CONSTRAINT job_state_due_at_in_range CHECK (due_at <@ dispatcher.due_at_range())
        NOT VALID;

-- The same names and purposes as before (migrations 001, 007, 009, 010, 013).
CREATE INDEX jobs_scheduled_due ON dispatcher.job_state (due_at) WHERE state = 'scheduled';
CREATE INDEX jobs_running_lease ON dispatcher.job_state (lease_expires_at)
    WHERE state = 'running';
CREATE INDEX jobs_running_queue ON dispatcher.job_state (queue) WHERE state = 'running';
CREATE INDEX jobs_terminal ON dispatcher.job_state (state, queue, finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');
CREATE INDEX jobs_discarded ON dispatcher.job_state (finished_at) WHERE state = 'discarded';
CREATE INDEX jobs_due_at_id ON dispatcher.job_state (due_at, id);
CREATE INDEX jobs_run_key_id ON dispatcher.job_state (run_key, id) WHERE run_key IS NOT NULL;
CREATE INDEX jobs_run_unfinished ON dispatcher.job_state (run_key)
    WHERE run_key IS NOT NULL AND state IN ('scheduled', 'ready', 'running');
-- The in-process claim walks ready jobs here, tenant by tenant (what outbox_claim did before).
CREATE INDEX jobs_ready_claim ON dispatcher.job_state (queue, tenant, id) WHERE state = 'ready';

-- The outbox only where a relay needs it. With the in-process transport a ready job is claimed
-- straight from its state row (jobs_ready_claim), and an outbox row per job was a write and a
-- delete that carried nothing. With RabbitMQ, the relay publishes outbox rows, so every
-- statement that makes a job ready writes one while this says so. The daemon keeps it in step
-- with its transport at start (sync_intake_settings), and fills in the rows of jobs that became
-- ready while it was off (every daemon of a database runs one transport).
ALTER TABLE dispatcher.intake_settings ADD COLUMN ready_outbox boolean NOT NULL DEFAULT false;

-- Created or changed here (bodies: db/functions/): dispatcher.ready_outbox; the view
-- dispatcher.jobs, with the columns, in the order, of the table it replaces, and its writes
-- (jobs_view_write, INSTEAD OF); dispatcher.run_receipts and the dead-letter notice, now from
-- the state rows; claim_grant counting running jobs in the state table; the doors inserting the
-- intent and its state row.
