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
-- view go through INSTEAD OF triggers (below) for everything else: operator actions, scripts,
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

DROP TRIGGER jobs_dead_letter_notice ON dispatcher.jobs;
DROP VIEW dispatcher.run_receipts;

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

CREATE FUNCTION dispatcher.ready_outbox() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT s.ready_outbox FROM dispatcher.intake_settings s), false)
$$;

-- The columns, in the order, of the table this replaces. `queue` and `run_key` come from the
-- state row so that a filter on either next to `state` reaches the state table's indexes.
CREATE VIEW dispatcher.jobs AS
SELECT i.id, i.key, i.request_hash, s.queue, i.tenant, i.handler, i.handler_version, i.target,
       i.payload, s.state, s.due_at, s.attempt, i.max_attempts, i.max_retry_age_s,
       s.budget_started_at, s.lease_owner, s.lease_expires_at, s.cancel_requested, s.progress,
       s.result, s.last_error, s.dead_reason, s.run_key, i.created_at, s.started_at,
       s.finished_at, i.dead_letter_of, i.traceparent
  FROM dispatcher.intents i
  JOIN dispatcher.job_state s ON s.id = i.id;

ALTER VIEW dispatcher.jobs ALTER COLUMN tenant SET DEFAULT '';
ALTER VIEW dispatcher.jobs ALTER COLUMN handler_version SET DEFAULT 1;
ALTER VIEW dispatcher.jobs ALTER COLUMN attempt SET DEFAULT 0;
ALTER VIEW dispatcher.jobs ALTER COLUMN cancel_requested SET DEFAULT false;
ALTER VIEW dispatcher.jobs ALTER COLUMN created_at SET DEFAULT now();

-- Writes through the view. An UPDATE applies only the columns the statement changed, and only
-- while the row is still in the state the statement read (same state, attempt and lease
-- owner): a view has no row lock of its own, so without that check an operator's update read
-- before a concurrent claim would overwrite the claim. Such a row counts as not updated.
CREATE FUNCTION dispatcher.jobs_view_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO dispatcher.intents
               (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                max_attempts, max_retry_age_s, run_key, created_at, dead_letter_of, traceparent)
        VALUES (NEW.key, NEW.request_hash, NEW.queue, NEW.tenant, NEW.handler,
                NEW.handler_version, NEW.target, NEW.payload, NEW.max_attempts,
                NEW.max_retry_age_s, NEW.run_key, NEW.created_at, NEW.dead_letter_of,
                NEW.traceparent)
        RETURNING id INTO NEW.id;
        INSERT INTO dispatcher.job_state
               (id, queue, run_key, tenant, capability, state, due_at, attempt, budget_started_at,
                lease_owner, lease_expires_at, cancel_requested, progress, result, last_error,
                dead_reason, started_at, finished_at)
        VALUES (NEW.id, NEW.queue, NEW.run_key, NEW.tenant,
                NEW.handler || ':' || NEW.handler_version, NEW.state, NEW.due_at, NEW.attempt,
                NEW.budget_started_at, NEW.lease_owner, NEW.lease_expires_at,
                NEW.cancel_requested, NEW.progress, NEW.result, NEW.last_error, NEW.dead_reason,
                NEW.started_at, NEW.finished_at);
        RETURN NEW;
    ELSIF TG_OP = 'DELETE' THEN
        DELETE FROM dispatcher.job_state WHERE id = OLD.id;
        DELETE FROM dispatcher.intents WHERE id = OLD.id;
        RETURN OLD;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id THEN
        RAISE EXCEPTION 'dispatcher.jobs: a job''s id cannot change'
            USING ERRCODE = '0A000', HINT = 'create a new job instead';
    END IF;
    UPDATE dispatcher.job_state s SET
        queue = CASE WHEN NEW.queue IS DISTINCT FROM OLD.queue THEN NEW.queue ELSE s.queue END,
        run_key = CASE WHEN NEW.run_key IS DISTINCT FROM OLD.run_key
                       THEN NEW.run_key ELSE s.run_key END,
        tenant = CASE WHEN NEW.tenant IS DISTINCT FROM OLD.tenant
                      THEN NEW.tenant ELSE s.tenant END,
        capability = CASE WHEN (NEW.handler, NEW.handler_version)
                               IS DISTINCT FROM (OLD.handler, OLD.handler_version)
                          THEN NEW.handler || ':' || NEW.handler_version ELSE s.capability END,
        state = CASE WHEN NEW.state IS DISTINCT FROM OLD.state THEN NEW.state ELSE s.state END,
        due_at = CASE WHEN NEW.due_at IS DISTINCT FROM OLD.due_at
                      THEN NEW.due_at ELSE s.due_at END,
        attempt = CASE WHEN NEW.attempt IS DISTINCT FROM OLD.attempt
                       THEN NEW.attempt ELSE s.attempt END,
        budget_started_at = CASE WHEN NEW.budget_started_at IS DISTINCT FROM OLD.budget_started_at
                                 THEN NEW.budget_started_at ELSE s.budget_started_at END,
        lease_owner = CASE WHEN NEW.lease_owner IS DISTINCT FROM OLD.lease_owner
                           THEN NEW.lease_owner ELSE s.lease_owner END,
        lease_expires_at = CASE WHEN NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at
                                THEN NEW.lease_expires_at ELSE s.lease_expires_at END,
        cancel_requested = CASE WHEN NEW.cancel_requested IS DISTINCT FROM OLD.cancel_requested
                                THEN NEW.cancel_requested ELSE s.cancel_requested END,
        progress = CASE WHEN NEW.progress IS DISTINCT FROM OLD.progress
                        THEN NEW.progress ELSE s.progress END,
        result = CASE WHEN NEW.result IS DISTINCT FROM OLD.result
                      THEN NEW.result ELSE s.result END,
        last_error = CASE WHEN NEW.last_error IS DISTINCT FROM OLD.last_error
                          THEN NEW.last_error ELSE s.last_error END,
        dead_reason = CASE WHEN NEW.dead_reason IS DISTINCT FROM OLD.dead_reason
                           THEN NEW.dead_reason ELSE s.dead_reason END,
        started_at = CASE WHEN NEW.started_at IS DISTINCT FROM OLD.started_at
                          THEN NEW.started_at ELSE s.started_at END,
        finished_at = CASE WHEN NEW.finished_at IS DISTINCT FROM OLD.finished_at
                           THEN NEW.finished_at ELSE s.finished_at END
     WHERE s.id = OLD.id
       AND (s.state, s.attempt, s.lease_owner)
           IS NOT DISTINCT FROM (OLD.state, OLD.attempt, OLD.lease_owner);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF (NEW.key, NEW.request_hash, NEW.queue, NEW.run_key, NEW.tenant, NEW.handler,
        NEW.handler_version, NEW.target,
        NEW.payload, NEW.max_attempts, NEW.max_retry_age_s, NEW.created_at, NEW.dead_letter_of,
        NEW.traceparent)
       IS DISTINCT FROM
       (OLD.key, OLD.request_hash, OLD.queue, OLD.run_key, OLD.tenant, OLD.handler,
        OLD.handler_version, OLD.target,
        OLD.payload, OLD.max_attempts, OLD.max_retry_age_s, OLD.created_at, OLD.dead_letter_of,
        OLD.traceparent) THEN
        UPDATE dispatcher.intents SET
            key = NEW.key, request_hash = NEW.request_hash, queue = NEW.queue,
            run_key = NEW.run_key, tenant = NEW.tenant,
            handler = NEW.handler, handler_version = NEW.handler_version, target = NEW.target,
            payload = NEW.payload, max_attempts = NEW.max_attempts,
            max_retry_age_s = NEW.max_retry_age_s, created_at = NEW.created_at,
            dead_letter_of = NEW.dead_letter_of, traceparent = NEW.traceparent
         WHERE id = OLD.id;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_view_write INSTEAD OF INSERT OR UPDATE OR DELETE ON dispatcher.jobs
    FOR EACH ROW EXECUTE FUNCTION dispatcher.jobs_view_write();

-- Migration 010's receipts, now from the state rows alone (run_key and state both live there).
CREATE VIEW dispatcher.run_receipts AS
SELECT r.run_key, r.schedule, r.period_start, r.via, r.unit_count, r.overlap_decision,
       r.overlap_with, r.created_at, r.released_at, r.finished_at,
       CASE WHEN u.pruned THEN r.succeeded ELSE u.succeeded END AS succeeded,
       CASE WHEN u.pruned THEN r.dead ELSE u.dead END AS dead,
       CASE WHEN u.pruned THEN r.cancelled ELSE u.cancelled END AS cancelled,
       CASE WHEN u.pruned THEN coalesce(r.discarded, 0) ELSE u.discarded END AS discarded
  FROM dispatcher.runs r
 CROSS JOIN LATERAL (
       SELECT count(*)::int AS total,
              count(*) FILTER (WHERE j.state = 'succeeded')::int AS succeeded,
              count(*) FILTER (WHERE j.state = 'dead')::int AS dead,
              count(*) FILTER (WHERE j.state = 'cancelled')::int AS cancelled,
              count(*) FILTER (WHERE j.state = 'discarded')::int AS discarded,
              (r.finished_at IS NOT NULL AND r.succeeded IS NOT NULL
               AND count(*) < r.unit_count) AS pruned
         FROM dispatcher.job_state j
        WHERE j.run_key = r.run_key) u;

-- Migration 007's dead-letter notice, fired by the state row; it reads the whole job through
-- the view (AFTER the update, so the view already shows the dead state).
CREATE OR REPLACE FUNCTION dispatcher.dead_letter_notice() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    j        dispatcher.jobs;
    origin   dispatcher.queues;
    notice_q dispatcher.queues;
    version  integer;
    died_at  timestamptz := coalesce(NEW.finished_at, now());
    body     jsonb;
    notice   text;
    new_id   bigint;
BEGIN
    SELECT * INTO j FROM dispatcher.jobs WHERE id = NEW.id;
    IF j.dead_letter_of IS NOT NULL THEN
        RETURN NULL;  -- a notification that died: visible as a dead letter, never notified
    END IF;
    SELECT * INTO origin FROM dispatcher.queues q WHERE q.name = j.queue;
    IF origin.on_dead_target IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO notice_q FROM dispatcher.queues q
     WHERE q.name = coalesce(origin.on_dead_queue, j.queue);
    IF notice_q.name IS NULL THEN
        notice_q := origin;
    END IF;
    SELECT h.current_version INTO version FROM dispatcher.handlers h WHERE h.name = 'http';
    -- One notification per death: a job dies at most once per attempt budget, and the key
    -- carries the moment it died, so a job redriven and dead again is reported again.
    notice := format('dead-letter:%s:%s', j.id,
                     to_char(died_at AT TIME ZONE 'UTC', 'YYYYMMDD"T"HH24MISS.US"Z"'));
    body := jsonb_build_object(
        'type', 'job.dead',
        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', jsonb_build_object(
            'id', j.id, 'key', j.key, 'queue', j.queue, 'tenant', nullif(j.tenant, ''),
            'handler', j.handler, 'attempt', j.attempt, 'max_attempts', j.max_attempts,
            'reason', j.dead_reason, 'last_error', j.last_error, 'run_key', j.run_key,
            'died_at', to_char(died_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
    INSERT INTO dispatcher.intents AS i
           (key, request_hash, queue, tenant, handler, handler_version, target, payload,
            max_attempts, max_retry_age_s, dead_letter_of)
    VALUES (notice,
            dispatcher.request_fingerprint('http', origin.on_dead_target, body, notice_q.name,
                                           j.tenant, NULL, NULL, NULL),
            notice_q.name, j.tenant, 'http', coalesce(version, 1), origin.on_dead_target, body,
            notice_q.max_attempts, notice_q.max_retry_age_s, j.id)
        ON CONFLICT (key) DO NOTHING
    RETURNING i.id INTO new_id;
    IF new_id IS NOT NULL THEN
        INSERT INTO dispatcher.job_state (id, queue, tenant, capability, state, due_at,
                                          budget_started_at)
        VALUES (new_id, notice_q.name, j.tenant, 'http:' || coalesce(version, 1), 'ready', now(),
                now());
        IF dispatcher.ready_outbox() THEN
            INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
            VALUES (new_id, notice_q.name, j.tenant, 'http:' || coalesce(version, 1));
        END IF;
        PERFORM pg_notify('dispatcher_wake', 'ready');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_dead_letter_notice
    AFTER UPDATE OF state ON dispatcher.job_state
    FOR EACH ROW
    WHEN (NEW.state = 'dead' AND OLD.state IS DISTINCT FROM 'dead')
    EXECUTE FUNCTION dispatcher.dead_letter_notice();

-- Migration 013's grant, counting running jobs in the state table.
CREATE OR REPLACE FUNCTION dispatcher.claim_grant(q text, wanted integer, OUT granted integer,
                                       OUT wait_s float8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r       dispatcher.queues;
    at      timestamptz;
    avail   float8;
    running integer := 0;
BEGIN
    granted := greatest(wanted, 0);
    SELECT * INTO r FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR (r.rate_per_s IS NULL AND r.max_inflight IS NULL) THEN
        RETURN;  -- unlimited: no lock, claims of this queue run in parallel
    END IF;
    SELECT * INTO r FROM dispatcher.queues WHERE name = q FOR UPDATE;
    -- the clock read after the lock; never behind the last refill, so tokens never repeat
    at := greatest(r.tokens_at, clock_timestamp());
    IF r.rate_per_s IS NOT NULL THEN
        avail := least(r.burst, r.tokens
                       + extract(epoch FROM at - r.tokens_at) * r.rate_per_s);
        granted := least(granted, floor(avail)::integer);
        IF granted < 1 THEN
            wait_s := (1 - avail) / r.rate_per_s;
        END IF;
    END IF;
    IF r.max_inflight IS NOT NULL AND granted > 0 THEN
        SELECT count(*) INTO running FROM (
            SELECT 1 FROM dispatcher.job_state
             WHERE queue = q AND state = 'running' LIMIT r.max_inflight) j;
        granted := greatest(0, least(granted, r.max_inflight - running));
        IF granted < 1 AND wanted > 0 THEN
            -- full across all daemons: a slot frees when any of them completes a job, which
            -- no wake-up tells us about, so look again soon (one short statement)
            wait_s := 0.02;
        END IF;
    END IF;
    IF r.rate_per_s IS NOT NULL THEN
        UPDATE dispatcher.queues SET tokens = avail - granted, tokens_at = at WHERE name = q;
    END IF;
END
$$;

-- Migration 011's SQL door, inserting the intent and its state row.
CREATE OR REPLACE FUNCTION dispatcher.enqueue_many_internal(
    keys            text[],
    handlers        text[],
    payloads        jsonb[],
    due_ats         timestamptz[] DEFAULT NULL,
    queues          text[] DEFAULT NULL,
    tenants         text[] DEFAULT NULL,
    targets         jsonb[] DEFAULT NULL,
    max_attempts    integer[] DEFAULT NULL,
    max_retry_age_s integer[] DEFAULT NULL,
    run_keys        text[] DEFAULT NULL
) RETURNS SETOF dispatcher.enqueue_result
LANGUAGE plpgsql
-- a generic plan (cached after five calls) guesses ~10 items per array and goes quadratic
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    n          integer := coalesce(cardinality(keys), 0);
    pending    integer[];          -- NULL = every item; else the ordinals still unresolved
    results    dispatcher.enqueue_result[];
    bad        text;
    rounds     integer := 0;
    any_ready  boolean := false;
    any_later  boolean := false;
    bad_item   bigint;
    bad_due    timestamptz;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(handlers), 0) <> n OR coalesce(cardinality(payloads), 0) <> n
       OR cardinality(due_ats) <> n OR cardinality(queues) <> n OR cardinality(tenants) <> n
       OR cardinality(targets) <> n OR cardinality(max_attempts) <> n
       OR cardinality(max_retry_age_s) <> n OR cardinality(run_keys) <> n THEN
        RAISE EXCEPTION 'dispatcher.enqueue_many: every array must have % elements, one per job', n
            USING ERRCODE = '22023', HINT = 'pass NULL instead of an array to use the defaults';
    END IF;
    SELECT u.o, u.d INTO bad_item, bad_due
      FROM unnest(due_ats) WITH ORDINALITY AS u(d, o)
     WHERE NOT (u.d <@ dispatcher.due_at_range())
     ORDER BY u.o
     LIMIT 1;
    IF bad_item IS NOT NULL THEN
        PERFORM dispatcher.refuse_due_at(bad_due, bad_item);
    END IF;

    LOOP
        WITH input AS (
            SELECT u.o::integer AS o, u.k, u.h, u.p, u.d AS requested_due,
                   coalesce(u.q, 'default') AS q, coalesce(u.t, '') AS t, u.tg, u.ma, u.mra, u.rk,
                   qd.max_attempts AS queue_ma, qd.max_retry_age_s AS queue_mra,
                   hd.current_version AS hv,
                   CASE
                       -- (not '^[ -~]{1,255}$': a bounded repeat makes the regex slow)
                       WHEN u.k IS NULL OR length(u.k) NOT BETWEEN 1 AND 255
                            OR u.k ~ '[^ -~]' THEN
                           format('a key is 1 to 255 printable ASCII characters|invalid key %L', u.k)
                       WHEN hd.name IS NULL THEN
                           format('use "http" or a handler configured in [handlers] (see '
                                  'dispatcher.handlers)|unknown handler %L', u.h)
                       WHEN qd.name IS NULL THEN
                           format('use a queue configured in [queues] (see dispatcher.queues), or '
                                  'NULL for default|unknown queue %L', u.q)
                       WHEN u.p IS NULL OR jsonb_typeof(u.p) <> 'object' THEN
                           'e.g. jsonb_build_object(''value'', 42)|payload must be a JSON object'
                       WHEN CASE WHEN u.h = 'http'
                                 THEN jsonb_typeof(u.tg -> 'url') IS DISTINCT FROM 'string'
                                 ELSE u.tg IS NOT NULL END THEN
                           'pass target only with handler "http"|handler "http" needs target '
                           '{"url": ...}, other handlers take no target'
                       WHEN u.ma < 1 OR u.mra < 0 THEN
                           'pass NULL to use the queue''s defaults|max_attempts must be >= 1 and '
                           'max_retry_age_s >= 0'
                   END AS invalid
              FROM unnest(keys, handlers, payloads, due_ats, queues, tenants, targets,
                          max_attempts, max_retry_age_s, run_keys)
                   WITH ORDINALITY AS u(k, h, p, d, q, t, tg, ma, mra, rk, o)
              LEFT JOIN dispatcher.queues qd ON qd.name = coalesce(u.q, 'default')
              LEFT JOIN dispatcher.handlers hd ON hd.name = u.h
             WHERE pending IS NULL OR u.o = ANY (pending)
        ), prepared AS (
            SELECT i.*,
                   dispatcher.request_fingerprint(i.h, i.tg, i.p, i.q, i.t, i.requested_due, i.ma,
                                                  i.mra) AS fingerprint,
                   coalesce(i.requested_due, now()) AS effective_due,
                   min(i.o) OVER (PARTITION BY i.k) AS first_o
              FROM input i
             WHERE i.invalid IS NULL
        ), ins_intent AS (
            INSERT INTO dispatcher.intents AS j
                   (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                    max_attempts, max_retry_age_s, run_key)
            SELECT p.k, p.fingerprint, p.q, p.t, p.h, p.hv, p.tg, p.p,
                   coalesce(p.ma, p.queue_ma), coalesce(p.mra, p.queue_mra), p.rk
              FROM prepared p ORDER BY p.o
                ON CONFLICT (key) DO NOTHING
            RETURNING j.id, j.key, j.request_hash, j.created_at, j.queue, j.tenant, j.handler,
                      j.handler_version, j.run_key
        ), ins_state AS (
            -- a key given twice in one call is inserted once, from its first item
            INSERT INTO dispatcher.job_state AS s (id, queue, run_key, tenant, capability, state,
                                                   due_at, budget_started_at)
            SELECT n.id, n.queue, n.run_key, n.tenant, n.handler || ':' || n.handler_version,
                   CASE WHEN p.effective_due <= now() THEN 'ready' ELSE 'scheduled' END,
                   p.effective_due, greatest(p.effective_due, now())
              FROM ins_intent n JOIN prepared p ON p.k = n.key AND p.o = p.first_o
            RETURNING s.id, s.state, s.due_at
        ), ins AS (
            SELECT n.*, st.state, st.due_at FROM ins_intent n JOIN ins_state st ON st.id = n.id
        ), outboxed AS (
            INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
            SELECT ins.id, ins.queue, ins.tenant, ins.handler || ':' || ins.handler_version
              FROM ins WHERE ins.state = 'ready' AND dispatcher.ready_outbox()
        )
        SELECT min(i.invalid) FILTER (WHERE i.invalid IS NOT NULL),
               array_agg(ROW(
                   p.o, coalesce(ins.id, e.id), p.k, coalesce(ins.state, e.state),
                   coalesce(ins.due_at, e.due_at), coalesce(ins.created_at, e.created_at),
                   CASE
                       WHEN ins.id IS NOT NULL THEN
                           CASE WHEN ins.request_hash <> p.fingerprint THEN 'conflict'
                                WHEN p.o = p.first_o THEN 'created'
                                ELSE 'existing' END
                       WHEN e.id IS NULL THEN 'retry'   -- a concurrent insert not yet visible
                       WHEN e.request_hash = p.fingerprint THEN 'existing'
                       -- a job accepted before migration 005 carries an md5 fingerprint
                       WHEN e.request_hash NOT LIKE 'v2:%' AND e.request_hash
                            = dispatcher.request_hash(p.h, p.tg, p.p, p.q, p.t, p.requested_due,
                                                      p.ma, p.mra) THEN 'existing'
                       ELSE 'conflict'
                   END)::dispatcher.enqueue_result ORDER BY p.o) FILTER (WHERE p.o IS NOT NULL)
          INTO bad, results
          FROM input i
          LEFT JOIN prepared p ON p.o = i.o
          LEFT JOIN ins ON ins.key = p.k
          -- OFFSET 0 keeps this a per-item index probe: flattened, the planner may hash-join a
          -- sequential scan of the whole jobs table instead.
          LEFT JOIN LATERAL (
               SELECT x.id, x.state, x.due_at, x.created_at, x.request_hash
                 FROM dispatcher.jobs x WHERE x.key = p.k AND ins.id IS NULL OFFSET 0) e ON true;

        IF bad IS NOT NULL THEN  -- raising undoes this call's inserts
            -- `bad` is 'hint|message': hints never contain '|', messages may (keys do)
            RAISE EXCEPTION 'dispatcher.enqueue: %', substr(bad, strpos(bad, '|') + 1)
                USING ERRCODE = '22023', HINT = split_part(bad, '|', 1);
        END IF;
        RETURN QUERY SELECT * FROM unnest(results) r WHERE r.outcome <> 'retry';
        any_ready := any_ready OR EXISTS (
            SELECT 1 FROM unnest(results) r WHERE r.outcome = 'created' AND r.state = 'ready');
        any_later := any_later OR EXISTS (
            SELECT 1 FROM unnest(results) r WHERE r.outcome = 'created' AND r.state = 'scheduled');
        pending := ARRAY(SELECT r.ord FROM unnest(results) r WHERE r.outcome = 'retry');
        EXIT WHEN cardinality(pending) = 0;
        rounds := rounds + 1;
        IF rounds > 50 THEN
            RAISE EXCEPTION 'dispatcher.enqueue: could not resolve concurrent inserts of the same keys'
                USING ERRCODE = '40001', HINT = 'retry the transaction';
        END IF;
    END LOOP;

    -- the payload tells listeners whom to wake: workers (ready) or the due-scan (scheduled)
    IF any_ready THEN
        PERFORM pg_notify('dispatcher_wake', 'ready');
    END IF;
    IF any_later THEN
        PERFORM pg_notify('dispatcher_wake', 'scheduled');
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION dispatcher.enqueue(
    key             text,
    handler         text,
    payload         jsonb DEFAULT '{}',
    due_at          timestamptz DEFAULT NULL,
    queue           text DEFAULT NULL,
    tenant          text DEFAULT NULL,
    target          jsonb DEFAULT NULL,
    max_attempts    integer DEFAULT NULL,
    max_retry_age_s integer DEFAULT NULL
) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    queue_name  text := coalesce(queue, 'default');
    tenant_name text := coalesce(tenant, '');
    effective   timestamptz := coalesce(due_at, now());
    defaults    dispatcher.queues;
    version     integer;
    fingerprint text;
    new_id      bigint;
    new_state   text;
    found_id    bigint;
    found_hash  text;
    tolerance_s float8 := dispatcher.due_at_past_tolerance_s();
BEGIN
    IF key IS NULL OR length(key) NOT BETWEEN 1 AND 255 OR key ~ '[^ -~]' THEN
        RAISE EXCEPTION 'dispatcher.enqueue: invalid key %', quote_nullable(key)
            USING ERRCODE = '22023', HINT = 'a key is 1 to 255 printable ASCII characters';
    END IF;
    SELECT h.current_version INTO version FROM dispatcher.handlers h WHERE h.name = handler;
    IF version IS NULL THEN
        RAISE EXCEPTION 'dispatcher.enqueue: unknown handler %', quote_nullable(handler)
            USING ERRCODE = '22023',
                  HINT = 'use "http" or a handler configured in [handlers] (see dispatcher.handlers)';
    END IF;
    SELECT * INTO defaults FROM dispatcher.queues q WHERE q.name = queue_name;
    IF defaults.name IS NULL THEN
        RAISE EXCEPTION 'dispatcher.enqueue: unknown queue %', quote_literal(queue_name)
            USING ERRCODE = '22023',
                  HINT = 'use a queue configured in [queues] (see dispatcher.queues), or NULL for default';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'dispatcher.enqueue: payload must be a JSON object'
            USING ERRCODE = '22023', HINT = 'e.g. jsonb_build_object(''value'', 42)';
    END IF;
    IF (CASE WHEN handler = 'http' THEN jsonb_typeof(target -> 'url') IS DISTINCT FROM 'string'
             ELSE target IS NOT NULL END) THEN
        RAISE EXCEPTION 'dispatcher.enqueue: handler "http" needs target {"url": ...}, other handlers take no target'
            USING ERRCODE = '22023', HINT = 'pass target only with handler "http"';
    END IF;
    IF max_attempts < 1 OR max_retry_age_s < 0 THEN
        RAISE EXCEPTION 'dispatcher.enqueue: max_attempts must be >= 1 and max_retry_age_s >= 0'
            USING ERRCODE = '22023', HINT = 'pass NULL to use the queue''s defaults';
    END IF;
    IF NOT (due_at <@ dispatcher.due_at_range()) THEN
        PERFORM dispatcher.refuse_due_at(due_at);
    END IF;
    IF due_at < now() - make_interval(secs => tolerance_s) THEN
        PERFORM dispatcher.refuse_past_due(due_at, tolerance_s);
    END IF;
    fingerprint := dispatcher.request_fingerprint(handler, target, payload, queue_name,
                                                  tenant_name, due_at, max_attempts,
                                                  max_retry_age_s);
    FOR round IN 1..50 LOOP
        INSERT INTO dispatcher.intents AS j
               (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                max_attempts, max_retry_age_s)
        VALUES (key, fingerprint, queue_name, tenant_name, handler, version, target, payload,
                coalesce(max_attempts, defaults.max_attempts),
                coalesce(max_retry_age_s, defaults.max_retry_age_s))
            ON CONFLICT ON CONSTRAINT jobs_key_key DO NOTHING
        RETURNING j.id INTO new_id;
        IF new_id IS NOT NULL THEN
            new_state := CASE WHEN effective <= now() THEN 'ready' ELSE 'scheduled' END;
            INSERT INTO dispatcher.job_state (id, queue, tenant, capability, state, due_at,
                                              budget_started_at)
            VALUES (new_id, queue_name, tenant_name, handler || ':' || version, new_state,
                    effective, greatest(effective, now()));
            IF new_state = 'ready' AND dispatcher.ready_outbox() THEN
                INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
                VALUES (new_id, queue_name, tenant_name, handler || ':' || version);
            END IF;
            PERFORM pg_notify('dispatcher_wake', new_state);
            RETURN new_id;
        END IF;
        SELECT j.id, j.request_hash INTO found_id, found_hash
          FROM dispatcher.jobs j WHERE j.key = enqueue.key;
        IF found_id IS NOT NULL THEN
            IF found_hash <> fingerprint AND (found_hash LIKE 'v2:%' OR found_hash
                   <> dispatcher.request_hash(handler, target, payload, queue_name, tenant_name,
                                              due_at, max_attempts, max_retry_age_s)) THEN
                RAISE EXCEPTION 'dispatcher.enqueue: key % already names job % with a different request',
                    key, found_id
                    USING ERRCODE = '23505',
                          HINT = 'resend the original request unchanged, or choose a new key for new work';
            END IF;
            RETURN found_id;
        END IF;
        -- the conflicting insert was rolled back, or is not visible to this snapshot yet: retry
    END LOOP;
    RAISE EXCEPTION 'dispatcher.enqueue: could not resolve concurrent inserts of key %', key
        USING ERRCODE = '40001', HINT = 'retry the transaction';
END
$$;
