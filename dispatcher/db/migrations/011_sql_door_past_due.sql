-- The SQL door refuses due times long past, as the HTTP API does; a job's retry budget starts
-- when it is accepted or due, whichever is later.
--
-- 1. The tolerance. HTTP intake refuses a due_at more than `due_at_past_tolerance_s` (300 s)
--    before now: a time that far past is a mistake (a wrong year, a stale message), and "run
--    now" is said by omitting it. The database cannot read the daemon's configuration, so the
--    daemon writes the setting into dispatcher.intake_settings at every start, beside the queue
--    registry (JobRepository.sync_registry); until a daemon has started, the default holds.
--    Daemons sharing a database should share the setting: the last one started wins.
-- 2. The doors. dispatcher.enqueue and dispatcher.enqueue_many, what applications call, refuse
--    such a time with SQLSTATE 22023, naming the value (and the item of a batch), the tolerance
--    and the fix. The daemon's own callers use dispatcher.enqueue_many_internal, which checks
--    everything else alike: HTTP intake checks the tolerance itself, per item, since one bad
--    item of a batch must not reject the others (a 422 for that item); cron units, catch-up of
--    past periods included, carry no due time (due when created) and need no exception.
-- 3. The budget. budget_started_at was the due time, so a job accepted with a due time long
--    past (the SQL door let it in) was beyond `max_retry_age_s` at its first failure and died
--    with dead_reason 'max_retry_age' after one attempt (and a reschedule to a past time did
--    the same). It is now greatest(due time, now()). Waiting or running jobs whose budget started
--    before they were accepted get their acceptance time (one pass over the table on upgrade;
--    only such rows are written).

CREATE TABLE dispatcher.intake_settings (
    singleton               boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    due_at_past_tolerance_s float8 NOT NULL DEFAULT 300
        CHECK (due_at_past_tolerance_s BETWEEN 0 AND 315360000),  -- config.MAX_DURATION_S
    updated_at              timestamptz NOT NULL DEFAULT now()
);
INSERT INTO dispatcher.intake_settings DEFAULT VALUES;

CREATE FUNCTION dispatcher.due_at_past_tolerance_s() RETURNS float8
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT s.due_at_past_tolerance_s FROM dispatcher.intake_settings s), 300)
$$;

-- The doors' refusal of a due time long past: SQLSTATE 22023 (invalid parameter value), like
-- every other bad argument, with the value, the item of a batch and what to send instead.
CREATE FUNCTION dispatcher.refuse_past_due(due timestamptz, tolerance_s float8,
                                           item bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('dispatcher.enqueue: due_at %s%s is more than %s s in the past',
                         to_char(due AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                         CASE WHEN item IS NULL THEN '' ELSE format(' (item %s)', item) END,
                         tolerance_s),
        ERRCODE = '22023',
        HINT = 'pass NULL to run now, or a time to come (the daemon''s due_at_past_tolerance_s '
               'sets how far past is still accepted; see dispatcher.intake_settings)';
END
$$;

UPDATE dispatcher.jobs
   SET budget_started_at = created_at
 WHERE budget_started_at < created_at AND state IN ('scheduled', 'ready', 'running');

-- The daemon's door: enqueue_many as in 006, the budget starting at greatest(due, now()).
-- Applications call dispatcher.enqueue_many, which checks the tolerance first.

CREATE FUNCTION dispatcher.enqueue_many_internal(
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
                   greatest(p.effective_due, now()), p.rk
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

-- The SQL door for batches: refuses the call when an item is due long past, then does what
-- the daemon's door does.
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
AS $$
DECLARE
    tolerance_s float8 := dispatcher.due_at_past_tolerance_s();
    bad_item    bigint;
    bad_due     timestamptz;
BEGIN
    -- times out of range are left to the internal door's own refusal (22008)
    SELECT u.o, u.d INTO bad_item, bad_due
      FROM unnest(due_ats) WITH ORDINALITY AS u(d, o)
     WHERE u.d < now() - make_interval(secs => tolerance_s)
       AND u.d <@ dispatcher.due_at_range()
     ORDER BY u.o
     LIMIT 1;
    IF bad_item IS NOT NULL THEN
        PERFORM dispatcher.refuse_past_due(bad_due, tolerance_s, bad_item);
    END IF;
    RETURN QUERY SELECT * FROM dispatcher.enqueue_many_internal(
        keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
        max_retry_age_s, run_keys);
END
$$;

-- The SQL door for one job: as in 006, plus the tolerance; the budget starts at
-- greatest(due, now()).

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
        INSERT INTO dispatcher.jobs AS j
               (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                state, due_at, max_attempts, max_retry_age_s, budget_started_at)
        VALUES (key, fingerprint, queue_name, tenant_name, handler, version, target, payload,
                CASE WHEN effective <= now() THEN 'ready' ELSE 'scheduled' END, effective,
                coalesce(max_attempts, defaults.max_attempts),
                coalesce(max_retry_age_s, defaults.max_retry_age_s), greatest(effective, now()))
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
