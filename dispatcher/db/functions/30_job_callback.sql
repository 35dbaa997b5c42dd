-- Per-job callbacks (migration 030; docs/guides/callbacks.md). When a job that names an
-- `on_success` or `on_failure` target ends `succeeded` or `dead`, one signed http job reporting
-- the ending is inserted in the transaction that ends it, whichever path ends it (completion,
-- a failed last attempt, a rescued lease, expiry): the trigger is on the state row, so a kill
-- before the ending's commit leaves neither, and a stale attempt that no longer holds its lease
-- changes no row and fires nothing. The key is the job's id, the state and the moment it ended:
-- one push per ending (a job redriven and ended again reports again), and an ending written
-- twice could never enqueue two. The push is a job of the same queue with the queue's retries.
-- A callback never calls back (`callback_of` set, no targets copied): no loop.
CREATE OR REPLACE FUNCTION dispatcher.job_callback() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    i        dispatcher.intents;
    q        dispatcher.queues;
    target   jsonb;
    version  integer;
    ended_at timestamptz := coalesce(NEW.finished_at, now());
    excerpt  text;
    status   integer;
    body     jsonb;
    cb_key   text;
    new_id   bigint;
BEGIN
    -- the trigger's condition is the flag alone (see below): the ending is tested here
    IF NEW.state NOT IN ('succeeded', 'dead') OR OLD.state IS NOT DISTINCT FROM NEW.state THEN
        RETURN NULL;
    END IF;
    SELECT * INTO i FROM dispatcher.intents WHERE id = NEW.id;
    target := CASE NEW.state WHEN 'succeeded' THEN i.on_success ELSE i.on_failure END;
    IF target IS NULL OR i.callback_of IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO q FROM dispatcher.queues WHERE name = NEW.queue;
    SELECT h.current_version INTO version FROM dispatcher.handlers h WHERE h.name = 'http';
    -- the last attempt's history: a success's is on its state row (migration 062); a failure's
    -- is the row written by the same statement as the ending, or none when the job expired
    -- before any attempt
    IF NEW.state = 'succeeded' THEN
        excerpt := NEW.success_excerpt;
        status := NEW.success_http_status;
    ELSE
        SELECT a.excerpt, a.http_status INTO excerpt, status FROM dispatcher.attempts a
         WHERE a.job_id = NEW.id ORDER BY a.id DESC LIMIT 1;
    END IF;
    cb_key := format('callback:%s:%s:%s', NEW.id, NEW.state,
                     to_char(ended_at AT TIME ZONE 'UTC', 'YYYYMMDD"T"HH24MISS.US"Z"'));
    body := jsonb_build_object(
        'type', 'job.' || NEW.state,
        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', jsonb_build_object(
            'id', NEW.id, 'key', i.key, 'queue', NEW.queue, 'tenant', nullif(NEW.tenant, ''),
            'state', NEW.state, 'attempts', NEW.attempt, 'dead_reason', NEW.dead_reason,
            'last_error', NEW.last_error, 'http_status', status, 'excerpt', excerpt,
            'result', CASE WHEN NEW.state = 'succeeded' THEN NEW.result END,
            'ended_at', to_char(ended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
    INSERT INTO dispatcher.intents AS n
           (key, request_hash, queue, tenant, handler, handler_version, target, payload,
            max_attempts, max_retry_age_s, callback_of)
    VALUES (cb_key,
            dispatcher.request_fingerprint('http', target, body, NEW.queue, NEW.tenant, NULL,
                                           NULL, NULL),
            NEW.queue, NEW.tenant, 'http', coalesce(version, 1), target, body,
            coalesce(q.max_attempts, 10), coalesce(q.max_retry_age_s, 86400), NEW.id)
        ON CONFLICT (key) DO NOTHING
    RETURNING n.id INTO new_id;
    IF new_id IS NOT NULL THEN
        INSERT INTO dispatcher.job_state (id, queue, tenant, capability, state, due_at,
                                          budget_started_at)
        VALUES (new_id, NEW.queue, NEW.tenant, 'http:' || coalesce(version, 1), 'ready', now(),
                now());
        IF dispatcher.ready_outbox() THEN
            INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
            VALUES (new_id, NEW.queue, NEW.tenant, 'http:' || coalesce(version, 1));
        END IF;
        PERFORM dispatcher.wake('ready');
    END IF;
    RETURN NULL;
END
$$;

-- Only jobs that named a target reach the function: the flag is on the state row, so every
-- other job's state change costs one boolean test. The condition is the flag alone, and the
-- function tests the ending: a trigger's condition is read back from its stored node text and
-- prepared again by every statement that changes a state (a claim of one job included), and
-- the whole condition here and the dead-letter trigger's cost a claim of one job 78,000
-- PostgreSQL instructions (6 %), the two single tests about 16,000 (bench_instructions: a
-- claim of one job 1,280,943 -> 1,218,522).
CREATE OR REPLACE TRIGGER job_state_callback
    AFTER UPDATE OF state ON dispatcher.job_state
    FOR EACH ROW
    WHEN (NEW.has_callback)
    EXECUTE FUNCTION dispatcher.job_callback();
