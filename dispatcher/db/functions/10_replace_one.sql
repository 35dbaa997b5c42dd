-- dispatcher.enqueue's key modes (migration 032): the request under `key` met a job with
-- another request and asked (`on_key` replace or keep_due) to replace it. Answers as the HTTP
-- door does: the job's id once it carries this request; SQLSTATE 23505 when it is already
-- ready, running or finished (never replaced: the message names its state) or belongs to
-- another handler, queue or tenant; 40001 when it was pruned meanwhile (a retry answers it).
CREATE OR REPLACE FUNCTION dispatcher.replace_one(
    key text, handler text, payload jsonb, due_at timestamptz, queue text, tenant text,
    target jsonb, max_attempts integer, max_retry_age_s integer, priority integer,
    concurrency_key text, timeout_s float8, expires_at timestamptz, on_success jsonb,
    on_failure jsonb, on_key text, debounce_max_s integer
) RETURNS bigint LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    r dispatcher.enqueue_result;
BEGIN
    SELECT * INTO r FROM dispatcher.replace_scheduled(
        ARRAY[key], ARRAY[handler], ARRAY[payload], ARRAY[due_at], ARRAY[queue], ARRAY[tenant],
        ARRAY[target], ARRAY[max_attempts], ARRAY[max_retry_age_s], ARRAY[on_key = 'keep_due'],
        ARRAY[debounce_max_s], ARRAY[priority], ARRAY[concurrency_key], ARRAY[timeout_s],
        ARRAY[expires_at], ARRAY[on_success], ARRAY[on_failure]);
    IF r.outcome = 'replaced' THEN
        RETURN r.id;
    ELSIF r.outcome = 'not_replaced' THEN
        RAISE EXCEPTION 'dispatcher.enqueue: key % names job %, which is %: on_key % replaces only a scheduled job, so it was not changed',
            key, r.id, r.state, quote_literal(on_key)
            USING ERRCODE = '23505',
                  HINT = 'the job already started or ended with its request; choose a new key for new work';
    ELSIF r.outcome = 'conflict' THEN
        RAISE EXCEPTION 'dispatcher.enqueue: key % already names job % of another handler, queue or tenant',
            key, r.id
            USING ERRCODE = '23505',
                  HINT = 'a replacement keeps the job''s handler, queue and tenant; choose a new key for new work';
    END IF;
    RAISE EXCEPTION 'dispatcher.enqueue: the job key % named was pruned while it was replaced', key
        USING ERRCODE = '40001', HINT = 'retry the transaction';
END
$$;
