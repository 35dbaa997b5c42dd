-- Due times are finite and in range, at every door and in the table.
--
-- A due time of '-infinity' made every claim of its queue fail ("cannot subtract infinite
-- timestamps"), and 'infinity' made the due-scan fail every second; years Python cannot hold
-- (before 1 or after 9999) broke every read of the row. The accepted range is
-- dispatcher.due_at_range(): from 2000-01-01T00:00:00Z through 9999-12-31T23:59:59Z, both
-- included. The last whole second Python can represent in UTC is the upper end; Python's
-- datetime.max itself is what drivers send for 'infinity'. The HTTP API, cron and this file
-- hold the same bounds (dispatcher.scheduling.cron.EARLIEST_INSTANT / LATEST_INSTANT).
--
-- Rows already stored outside the range, as the doors let them in before:
-- - not a time at all (+-infinity) and not yet finished: set to `dead` with dead_reason
--   'invalid_due_at' and the original value in last_error; their outbox rows are withdrawn.
--   The request had no meaning to honour; an operator retry runs the job now.
-- - a time, but out of range (or a finished job): moved to the nearest end of the range,
--   which keeps its meaning ("long ago": due now; "year 20000": never in practice).
-- The same for budget_started_at, which the doors set from the due time.
-- That pass reads the whole table once; the constraint is then added NOT VALID, since every
-- row already satisfies it (a later `ALTER TABLE dispatcher.jobs VALIDATE CONSTRAINT
-- jobs_due_at_in_range` can record that without blocking writers).

CREATE FUNCTION dispatcher.due_at_range() RETURNS tstzrange
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT tstzrange('2000-01-01 00:00:00+00', '9999-12-31 23:59:59+00', '[]')
$$;

-- The doors' refusal: SQLSTATE 22008 (datetime field overflow), the value, the item of a batch,
-- and what to send instead.
CREATE FUNCTION dispatcher.refuse_due_at(due timestamptz, item bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    bounds tstzrange := dispatcher.due_at_range();
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('dispatcher.enqueue: due_at %s%s is out of range', due,
                         CASE WHEN item IS NULL THEN '' ELSE format(' (item %s)', item) END),
        ERRCODE = '22008',
        HINT = format('a due time is finite, from %s through %s; pass NULL to run now',
                      to_char(lower(bounds) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                      to_char(upper(bounds) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'));
END
$$;

WITH bad AS (
    SELECT id, state IN ('scheduled', 'ready', 'running') AND NOT isfinite(due_at) AS retire
      FROM dispatcher.jobs
     WHERE NOT (due_at <@ dispatcher.due_at_range())
        OR NOT (budget_started_at <@ dispatcher.due_at_range())
), fixed AS (
    UPDATE dispatcher.jobs j
       SET state = CASE WHEN b.retire THEN 'dead' ELSE j.state END,
           dead_reason = CASE WHEN b.retire THEN 'invalid_due_at' ELSE j.dead_reason END,
           last_error = CASE WHEN b.retire
                             THEN format('due_at %s is not a time (set to dead by migration 006; '
                                         'retry the job to run it now)', j.due_at)
                             ELSE j.last_error END,
           finished_at = CASE WHEN b.retire THEN now() ELSE j.finished_at END,
           lease_owner = CASE WHEN b.retire THEN NULL ELSE j.lease_owner END,
           lease_expires_at = CASE WHEN b.retire THEN NULL ELSE j.lease_expires_at END,
           due_at = least(greatest(j.due_at, lower(dispatcher.due_at_range())),
                          upper(dispatcher.due_at_range())),
           budget_started_at = least(greatest(j.budget_started_at,
                                              lower(dispatcher.due_at_range())),
                                     upper(dispatcher.due_at_range()))
      FROM bad b
     WHERE j.id = b.id
    RETURNING j.id, b.retire
)
DELETE FROM dispatcher.outbox o USING fixed f WHERE o.job_id = f.id AND f.retire;

ALTER TABLE dispatcher.jobs
    ADD CONSTRAINT jobs_due_at_in_range CHECK (due_at <@ dispatcher.due_at_range()) NOT VALID;

-- enqueue_many and enqueue as in 005, refusing a due time out of range.

CREATE OR REPLACE FUNCTION dispatcher.enqueue_many(
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
        ), ins AS (
            INSERT INTO dispatcher.jobs AS j
                   (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                    state, due_at, max_attempts, max_retry_age_s, budget_started_at, run_key)
            SELECT p.k, p.fingerprint, p.q, p.t, p.h, p.hv, p.tg, p.p,
                   CASE WHEN p.effective_due <= now() THEN 'ready' ELSE 'scheduled' END,
                   p.effective_due, coalesce(p.ma, p.queue_ma), coalesce(p.mra, p.queue_mra),
                   p.effective_due, p.rk
              FROM prepared p ORDER BY p.o
                ON CONFLICT (key) DO NOTHING
            RETURNING j.id, j.key, j.request_hash, j.state, j.due_at, j.created_at, j.queue,
                      j.tenant, j.handler, j.handler_version
        ), outboxed AS (
            INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
            SELECT ins.id, ins.queue, ins.tenant, ins.handler || ':' || ins.handler_version
              FROM ins WHERE ins.state = 'ready'
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
    fingerprint := dispatcher.request_fingerprint(handler, target, payload, queue_name,
                                                  tenant_name, due_at, max_attempts,
                                                  max_retry_age_s);
    FOR round IN 1..50 LOOP
        INSERT INTO dispatcher.jobs AS j
               (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                state, due_at, max_attempts, max_retry_age_s, budget_started_at)
        VALUES (key, fingerprint, queue_name, tenant_name, handler, version, target, payload,
                CASE WHEN effective <= now() THEN 'ready' ELSE 'scheduled' END, effective,
                coalesce(max_attempts, defaults.max_attempts),
                coalesce(max_retry_age_s, defaults.max_retry_age_s), effective)
            ON CONFLICT ON CONSTRAINT jobs_key_key DO NOTHING
        RETURNING j.id, j.state INTO new_id, new_state;
        IF new_id IS NOT NULL THEN
            IF new_state = 'ready' THEN
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
