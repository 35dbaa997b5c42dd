-- Dead-letter notifications. When a job becomes `dead` and its queue has an `on_dead` target,
-- a signed http job reporting the death is inserted in the same transaction (never lost, with
-- retries of its own). A trigger on the state row covers every path to `dead` at once; it
-- reads the whole job through the view (AFTER the update, so the view shows the dead state).
-- A notification job (dead_letter_of set) never notifies in turn, so a broken target cannot loop.
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
    IF OLD.state = 'dead' THEN
        RETURN NULL;  -- not a death (the trigger's condition tests the new state only)
    END IF;
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
        PERFORM dispatcher.wake('ready');
    END IF;
    RETURN NULL;
END
$$;

-- The condition is the new state alone; the function tests the old one (why: the callback
-- trigger's comment, 30_job_callback.sql).
CREATE OR REPLACE TRIGGER jobs_dead_letter_notice
    AFTER UPDATE OF state ON dispatcher.job_state
    FOR EACH ROW
    WHEN (NEW.state = 'dead')
    EXECUTE FUNCTION dispatcher.dead_letter_notice();
