-- Operator control: paused queues, the `discarded` state, and dead-letter notifications.
--
-- Paused queues. `dispatcher.queues.paused` is read by every claim (claim_ready: one primary-key
-- probe of this table per claim batch), so a pause holds on every daemon sharing the database
-- from the moment it commits, and across restarts. Intake and the due-scan ignore it: a paused
-- queue keeps accepting and keeps moving due jobs to `ready`, so its backlog stays visible.
-- The daemon's registry sync (upsert_queue) never writes these columns.
ALTER TABLE dispatcher.queues
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN paused_at timestamptz,
    -- Dead-letter notification of the queue (from the configuration's `on_dead`): the normalized
    -- http target, and the queue the notification job runs in (NULL: the dead job's own queue).
    ADD COLUMN on_dead_target jsonb,
    ADD COLUMN on_dead_queue text,
    ADD CONSTRAINT queues_paused_at CHECK (paused = (paused_at IS NOT NULL));

-- `discarded`: an operator's verdict on a dead letter (dead -> discarded only). It is terminal,
-- and pruned with the dead retention from the time the job died (finished_at), so the record
-- stays visible as long as the dead letter would have. Every existing row satisfies the wider
-- check, so it is added without a scan (NOT VALID, like 006).
ALTER TABLE dispatcher.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE dispatcher.jobs
    ADD CONSTRAINT jobs_state_check CHECK (state IN
        ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled', 'discarded')) NOT VALID;
-- The pruner's walk for discarded jobs (jobs_terminal covers the other terminal states). Empty
-- on upgrade, so it builds from one read of the table.
CREATE INDEX jobs_discarded ON dispatcher.jobs (finished_at) WHERE state = 'discarded';

-- Dead-letter notifications. When a job becomes `dead` and its queue has an `on_dead` target,
-- a signed http job reporting the death is inserted in the same transaction (so it is never
-- lost, and it has its own retries). A trigger, not a clause in each statement: a job goes dead
-- from a failed attempt (record_failure), from a lease rescue on its last attempt
-- (rescue_expired_leases), and from wherever a later change lets it; the trigger covers every
-- path at once. `dead_letter_of` marks a notification job (the id of the job it reports on):
-- such a job never notifies in turn when it dies, so a broken notification target cannot loop.
ALTER TABLE dispatcher.jobs ADD COLUMN dead_letter_of bigint;

CREATE FUNCTION dispatcher.dead_letter_notice() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    origin   dispatcher.queues;
    notice_q dispatcher.queues;
    version  integer;
    died_at  timestamptz := coalesce(NEW.finished_at, now());
    body     jsonb;
    notice   text;
    new_id   bigint;
BEGIN
    IF NEW.dead_letter_of IS NOT NULL THEN
        RETURN NULL;  -- a notification that died: visible as a dead letter, never notified
    END IF;
    SELECT * INTO origin FROM dispatcher.queues q WHERE q.name = NEW.queue;
    IF origin.on_dead_target IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO notice_q FROM dispatcher.queues q
     WHERE q.name = coalesce(origin.on_dead_queue, NEW.queue);
    IF notice_q.name IS NULL THEN
        notice_q := origin;
    END IF;
    SELECT h.current_version INTO version FROM dispatcher.handlers h WHERE h.name = 'http';
    -- One notification per death: a job dies at most once per attempt budget, and the key
    -- carries the moment it died, so a job redriven and dead again is reported again.
    notice := format('dead-letter:%s:%s', NEW.id,
                     to_char(died_at AT TIME ZONE 'UTC', 'YYYYMMDD"T"HH24MISS.US"Z"'));
    body := jsonb_build_object(
        'type', 'job.dead',
        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', jsonb_build_object(
            'id', NEW.id, 'key', NEW.key, 'queue', NEW.queue, 'tenant', nullif(NEW.tenant, ''),
            'handler', NEW.handler, 'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
            'reason', NEW.dead_reason, 'last_error', NEW.last_error, 'run_key', NEW.run_key,
            'died_at', to_char(died_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
    INSERT INTO dispatcher.jobs AS j
           (key, request_hash, queue, tenant, handler, handler_version, target, payload, state,
            due_at, max_attempts, max_retry_age_s, budget_started_at, dead_letter_of)
    VALUES (notice,
            dispatcher.request_fingerprint('http', origin.on_dead_target, body, notice_q.name,
                                           NEW.tenant, NULL, NULL, NULL),
            notice_q.name, NEW.tenant, 'http', coalesce(version, 1), origin.on_dead_target, body,
            'ready', now(), notice_q.max_attempts, notice_q.max_retry_age_s, now(), NEW.id)
        ON CONFLICT (key) DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NOT NULL THEN
        INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
        VALUES (new_id, notice_q.name, NEW.tenant, 'http:' || coalesce(version, 1));
        PERFORM pg_notify('dispatcher_wake', 'ready');
    END IF;
    RETURN NULL;
END
$$;

-- `UPDATE OF state` with a WHEN clause: statements that do not set `state` (heartbeats,
-- progress) never consider it, and for the others the check is one comparison per row; no
-- trigger call happens unless a row really becomes dead.
CREATE TRIGGER jobs_dead_letter_notice
    AFTER UPDATE OF state ON dispatcher.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'dead' AND OLD.state IS DISTINCT FROM 'dead')
    EXECUTE FUNCTION dispatcher.dead_letter_notice();
