-- The SQL door's check of one request's contract (issue 23, points 2, 6 and 7; migration 032):
-- its key mode, its deadline, its time to live and its callback targets, the rules the HTTP
-- door words in dispatcher/intake (requests.py, accept.py). Raises SQLSTATE 22023 naming the
-- field, the item of a batch and what to send instead; returns nothing for a valid contract.
-- dispatcher.enqueue calls it only when a contract field is set, dispatcher.enqueue_many only
-- for the items that set one, so a request without a contract pays nothing.
CREATE OR REPLACE FUNCTION dispatcher.refuse_contract(
    handler text, due_at timestamptz, timeout_s float8, expires_at timestamptz,
    on_success jsonb, on_failure jsonb, on_key text, debounce_max_s integer,
    item bigint DEFAULT NULL
) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    at   text := CASE WHEN item IS NULL THEN '' ELSE format(' (item %s)', item) END;
BEGIN
    IF on_key IS NOT NULL AND on_key NOT IN ('reject', 'replace', 'keep_due') THEN
        RAISE EXCEPTION 'dispatcher.enqueue: on_key % is not a key mode', quote_literal(on_key) || at
            USING ERRCODE = '22023',
                  HINT = 'reject (the default: another request under the key is a conflict), '
                         'replace (debounce) or keep_due (throttle)';
    END IF;
    IF debounce_max_s IS NOT NULL AND (coalesce(on_key, 'reject') <> 'replace'
                                       OR debounce_max_s NOT BETWEEN 0 AND 315360000) THEN
        RAISE EXCEPTION 'dispatcher.enqueue: debounce_max_s % needs on_key ''replace'' and 0 to 315360000 s',
            debounce_max_s || at
            USING ERRCODE = '22023',
                  HINT = 'keep_due never moves the due time and reject never replaces: pass NULL';
    END IF;
    IF timeout_s IS NOT NULL AND (handler = 'http' OR NOT timeout_s > 0 OR timeout_s
           > coalesce((SELECT h.max_timeout_s FROM dispatcher.handlers h
                        WHERE h.name = refuse_contract.handler), 'infinity')) THEN
        RAISE EXCEPTION 'dispatcher.enqueue: timeout_s % is not a deadline handler % allows',
            timeout_s || at, quote_literal(handler)
            USING ERRCODE = '22023',
                  HINT = 'more than 0 and at most the handler''s timeout_s (dispatcher.handlers.max_timeout_s); an http job''s deadline is target.timeout_s';
    END IF;
    IF expires_at IS NOT NULL AND (NOT (expires_at <@ dispatcher.due_at_range())
                                   OR expires_at <= greatest(coalesce(due_at, now()), now())) THEN
        RAISE EXCEPTION 'dispatcher.enqueue: expires_at % is not after the due time, or out of range',
            expires_at || at
            USING ERRCODE = '22023',
                  HINT = 'a time to live later than due_at (and now): the job could never start';
    END IF;
    IF jsonb_typeof(on_success -> 'url') IS DISTINCT FROM 'string' AND on_success IS NOT NULL
       OR jsonb_typeof(on_failure -> 'url') IS DISTINCT FROM 'string' AND on_failure IS NOT NULL THEN
        RAISE EXCEPTION 'dispatcher.enqueue: on_success and on_failure are targets {"url": ...}%', at
            USING ERRCODE = '22023', HINT = 'e.g. jsonb_build_object(''url'', ''https://...'')';
    END IF;
END
$$;
