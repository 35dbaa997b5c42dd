-- Writes through the view. An UPDATE applies only the columns the statement changed, and only
-- while the row is still in the state the statement read (same state, attempt and lease
-- owner): a view has no row lock of its own, so without that check an operator's update read
-- before a concurrent claim would overwrite the claim. Such a row counts as not updated.
CREATE OR REPLACE FUNCTION dispatcher.jobs_view_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO dispatcher.intents
               (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                max_attempts, max_retry_age_s, run_key, created_at, dead_letter_of, traceparent,
                priority, concurrency_key)
        VALUES (NEW.key, NEW.request_hash, NEW.queue, NEW.tenant, NEW.handler,
                NEW.handler_version, NEW.target, NEW.payload, NEW.max_attempts,
                NEW.max_retry_age_s, NEW.run_key, NEW.created_at, NEW.dead_letter_of,
                NEW.traceparent, NEW.priority, NEW.concurrency_key)
        RETURNING id INTO NEW.id;
        INSERT INTO dispatcher.job_state
               (id, queue, run_key, tenant, capability, state, due_at, attempt, budget_started_at,
                lease_owner, lease_expires_at, cancel_requested, progress, result, last_error,
                dead_reason, started_at, finished_at, priority, concurrency_key)
        VALUES (NEW.id, NEW.queue, NEW.run_key, NEW.tenant,
                NEW.handler || ':' || NEW.handler_version, NEW.state, NEW.due_at, NEW.attempt,
                NEW.budget_started_at, NEW.lease_owner, NEW.lease_expires_at,
                NEW.cancel_requested, NEW.progress, NEW.result, NEW.last_error, NEW.dead_reason,
                NEW.started_at, NEW.finished_at, NEW.priority, NEW.concurrency_key);
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
                           THEN NEW.finished_at ELSE s.finished_at END,
        priority = CASE WHEN NEW.priority IS DISTINCT FROM OLD.priority
                        THEN NEW.priority ELSE s.priority END,
        concurrency_key = CASE WHEN NEW.concurrency_key IS DISTINCT FROM OLD.concurrency_key
                               THEN NEW.concurrency_key ELSE s.concurrency_key END
     WHERE s.id = OLD.id
       AND (s.state, s.attempt, s.lease_owner)
           IS NOT DISTINCT FROM (OLD.state, OLD.attempt, OLD.lease_owner);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NEW.priority IS DISTINCT FROM OLD.priority THEN
        -- a ready job's relay row carries its priority (rare: an operator's change)
        UPDATE dispatcher.outbox SET priority = NEW.priority WHERE job_id = OLD.id;
    END IF;
    IF (NEW.key, NEW.request_hash, NEW.queue, NEW.run_key, NEW.tenant, NEW.handler,
        NEW.handler_version, NEW.target,
        NEW.payload, NEW.max_attempts, NEW.max_retry_age_s, NEW.created_at, NEW.dead_letter_of,
        NEW.traceparent, NEW.priority, NEW.concurrency_key)
       IS DISTINCT FROM
       (OLD.key, OLD.request_hash, OLD.queue, OLD.run_key, OLD.tenant, OLD.handler,
        OLD.handler_version, OLD.target,
        OLD.payload, OLD.max_attempts, OLD.max_retry_age_s, OLD.created_at, OLD.dead_letter_of,
        OLD.traceparent, OLD.priority, OLD.concurrency_key) THEN
        UPDATE dispatcher.intents SET
            key = NEW.key, request_hash = NEW.request_hash, queue = NEW.queue,
            run_key = NEW.run_key, tenant = NEW.tenant,
            handler = NEW.handler, handler_version = NEW.handler_version, target = NEW.target,
            payload = NEW.payload, max_attempts = NEW.max_attempts,
            max_retry_age_s = NEW.max_retry_age_s, created_at = NEW.created_at,
            dead_letter_of = NEW.dead_letter_of, traceparent = NEW.traceparent,
            priority = NEW.priority, concurrency_key = NEW.concurrency_key
         WHERE id = OLD.id;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER jobs_view_write
    INSTEAD OF INSERT OR UPDATE OR DELETE ON dispatcher.jobs
    FOR EACH ROW EXECUTE FUNCTION dispatcher.jobs_view_write();
