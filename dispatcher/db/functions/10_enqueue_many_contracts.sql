-- dispatcher.enqueue_many for a call that sets a contract (migration 032): the items are
-- enqueued as without one (dispatcher.enqueue_many_internal), then, in the same transaction,
-- as the HTTP door does (dispatcher/intake/accept.py, db/contracts.py): the contracts of the
-- jobs created are stored, a replay whose stored contract differs becomes a "conflict", and a
-- conflict whose item asked for a key mode replaces its scheduled job (replace_scheduled).
-- Every contract is checked before anything is written: an invalid one refuses the call.
CREATE OR REPLACE FUNCTION dispatcher.enqueue_many_contracts(
    keys text[], handlers text[], payloads jsonb[], due_ats timestamptz[], queues text[],
    tenants text[], targets jsonb[], max_attempts integer[], max_retry_age_s integer[],
    run_keys text[], priorities integer[], concurrency_keys text[], on_keys text[],
    debounce_max_s integer[], timeout_s float8[], expires_ats timestamptz[],
    on_success jsonb[], on_failure jsonb[]
) RETURNS SETOF dispatcher.enqueue_result LANGUAGE plpgsql AS $$
DECLARE
    n       integer := coalesce(cardinality(keys), 0);
    c       record;
    results dispatcher.enqueue_result[];
    asked   integer[];   -- the ordinals of the conflicts that asked to replace their job
    replaced dispatcher.enqueue_result[];
BEGIN
    IF cardinality(on_keys) <> n OR cardinality(debounce_max_s) <> n
       OR cardinality(timeout_s) <> n OR cardinality(expires_ats) <> n
       OR cardinality(on_success) <> n OR cardinality(on_failure) <> n THEN
        RAISE EXCEPTION 'dispatcher.enqueue_many: every array must have % elements, one per job', n
            USING ERRCODE = '22023', HINT = 'pass NULL instead of an array to use the defaults';
    END IF;
    FOR c IN SELECT u.*
               FROM unnest(handlers, due_ats, timeout_s, expires_ats, on_success, on_failure,
                           on_keys, debounce_max_s)
                    WITH ORDINALITY AS u(h, d, ts, ex, os, ofl, ok, dm, o)
              WHERE num_nonnulls(u.ts, u.ex, u.os, u.ofl, u.ok, u.dm) > 0
              ORDER BY u.o
    LOOP
        PERFORM dispatcher.refuse_contract(c.h, c.d, c.ts, c.ex, c.os, c.ofl, c.ok, c.dm, c.o);
    END LOOP;
    results := ARRAY(SELECT r::dispatcher.enqueue_result FROM dispatcher.enqueue_many_internal(
        keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
        max_retry_age_s, run_keys, priorities, concurrency_keys) r);

    -- the contracts of the jobs created (= ANY: index probes, as db/queries.sql set_contracts)
    WITH made AS (
        SELECT r.id, u.ts, u.ex, u.os, u.ofl
          FROM unnest(results) r
          JOIN unnest(timeout_s, expires_ats, on_success, on_failure)
               WITH ORDINALITY AS u(ts, ex, os, ofl, o) ON u.o = r.ord
         WHERE r.outcome = 'created' AND num_nonnulls(u.ts, u.ex, u.os, u.ofl) > 0
    ), intent AS (
        UPDATE dispatcher.intents i SET timeout_s = m.ts, on_success = m.os, on_failure = m.ofl
          FROM made m WHERE i.id = ANY (ARRAY(SELECT id FROM made)) AND i.id = m.id
    )
    UPDATE dispatcher.job_state s
       SET expires_at = m.ex, has_callback = num_nonnulls(m.os, m.ofl) > 0
      FROM made m WHERE s.id = ANY (ARRAY(SELECT id FROM made)) AND s.id = m.id;

    -- a replay is the same request only with the same contract
    results := ARRAY(
        SELECT CASE WHEN r.outcome = 'existing' AND EXISTS (
                        SELECT 1 FROM dispatcher.intents i JOIN dispatcher.job_state s ON s.id = i.id
                         WHERE i.id = r.id
                           AND (i.timeout_s, s.expires_at, i.on_success, i.on_failure)
                               IS DISTINCT FROM (u.ts, u.ex, u.os, u.ofl))
                    THEN ROW(r.ord, r.id, r.key, r.state, r.due_at, r.created_at,
                             'conflict')::dispatcher.enqueue_result
                    ELSE r END
          FROM unnest(results) r
          LEFT JOIN unnest(timeout_s, expires_ats, on_success, on_failure)
               WITH ORDINALITY AS u(ts, ex, os, ofl, o) ON u.o = r.ord);

    asked := ARRAY(SELECT r.ord FROM unnest(results) r
                    WHERE r.outcome = 'conflict' AND coalesce(on_keys[r.ord], 'reject') <> 'reject'
                    ORDER BY r.ord);
    IF cardinality(asked) > 0 THEN
        -- into an array first: a function scan inside a join may be run again per row
        replaced := ARRAY(SELECT x::dispatcher.enqueue_result FROM dispatcher.replace_scheduled(
            ARRAY(SELECT keys[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT handlers[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT payloads[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT due_ats[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT queues[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT tenants[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT targets[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT max_attempts[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT max_retry_age_s[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT on_keys[a.o] = 'keep_due' FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT debounce_max_s[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT priorities[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT concurrency_keys[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT timeout_s[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT expires_ats[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT on_success[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n),
            ARRAY(SELECT on_failure[a.o] FROM unnest(asked) WITH ORDINALITY AS a(o, n) ORDER BY a.n)) x);
        results := ARRAY(
            SELECT CASE WHEN x.ord IS NULL THEN r  -- not asked, or its job gone meanwhile
                        ELSE ROW(r.ord, x.id, x.key, x.state, x.due_at, x.created_at,
                                 x.outcome)::dispatcher.enqueue_result END
              FROM unnest(results) r
              LEFT JOIN unnest(replaced) x ON asked[x.ord] = r.ord);
    END IF;
    RETURN QUERY SELECT * FROM unnest(results) r ORDER BY r.ord;
END
$$;
