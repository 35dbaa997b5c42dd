-- The SQL door: applications enqueue inside their own transaction, so the intent commits or rolls
-- back together with their business change (the transactional outbox). The HTTP API uses the same
-- function, so both doors share one set of idempotency rules.

CREATE FUNCTION dispatcher.enqueue_many(
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
) RETURNS TABLE (ord integer, id bigint, key text, state text, due_at timestamptz,
                 created_at timestamptz, outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n          integer := coalesce(cardinality(keys), 0);
    pending    integer[];          -- NULL = every item; else the ordinals still unresolved
    unresolved integer[];
    created    boolean := false;
    rounds     integer := 0;
    rec        record;
    bad        text;
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

    SELECT format('key %L', k) INTO bad FROM unnest(keys) k
     WHERE k IS NULL OR k !~ '^[ -~]{1,255}$' LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'dispatcher.enqueue: invalid %', bad USING ERRCODE = '22023',
            HINT = 'a key is 1 to 255 printable ASCII characters';
    END IF;
    SELECT format('%L', h) INTO bad FROM unnest(handlers) h
     WHERE h IS NULL OR NOT EXISTS (SELECT 1 FROM dispatcher.handlers d WHERE d.name = h) LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'dispatcher.enqueue: unknown handler %', bad USING ERRCODE = '22023',
            HINT = 'use "http" or a handler configured in [handlers] (see dispatcher.handlers)';
    END IF;
    SELECT format('%L', q) INTO bad FROM unnest(queues) q
     WHERE q IS NOT NULL AND NOT EXISTS (SELECT 1 FROM dispatcher.queues d WHERE d.name = q) LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'dispatcher.enqueue: unknown queue %', bad USING ERRCODE = '22023',
            HINT = 'use a queue configured in [queues] (see dispatcher.queues), or NULL for default';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(payloads) p WHERE p IS NULL OR jsonb_typeof(p) <> 'object') THEN
        RAISE EXCEPTION 'dispatcher.enqueue: payload must be a JSON object' USING ERRCODE = '22023',
            HINT = 'wrap scalar values, e.g. jsonb_build_object(''value'', 42)';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(handlers, targets) AS t(h, tg)
                WHERE CASE WHEN h = 'http' THEN jsonb_typeof(tg -> 'url') IS DISTINCT FROM 'string'
                           ELSE tg IS NOT NULL END) THEN
        RAISE EXCEPTION 'dispatcher.enqueue: handler "http" needs target {"url": ...}, other handlers take no target'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(max_attempts) m WHERE m < 1)
       OR EXISTS (SELECT 1 FROM unnest(max_retry_age_s) m WHERE m < 0) THEN
        RAISE EXCEPTION 'dispatcher.enqueue: max_attempts must be >= 1 and max_retry_age_s >= 0'
            USING ERRCODE = '22023';
    END IF;

    LOOP
        unresolved := '{}';
        FOR rec IN
            WITH input AS (
                SELECT u.o::integer AS o, u.k, u.h, u.p, u.d AS requested_due,
                       coalesce(u.q, 'default') AS q, coalesce(u.t, '') AS t, u.tg, u.ma, u.mra, u.rk
                  FROM unnest(keys, handlers, payloads, due_ats, queues, tenants, targets,
                              max_attempts, max_retry_age_s, run_keys)
                       WITH ORDINALITY AS u(k, h, p, d, q, t, tg, ma, mra, rk, o)
                 WHERE pending IS NULL OR u.o = ANY (pending)
            ), prepared AS (
                SELECT i.*,
                       dispatcher.request_hash(i.h, i.tg, i.p, i.q, i.t, i.requested_due, i.ma, i.mra)
                           AS fingerprint,
                       coalesce(i.requested_due, now()) AS effective_due,
                       coalesce(i.ma, qd.max_attempts) AS effective_ma,
                       coalesce(i.mra, qd.max_retry_age_s) AS effective_mra,
                       hd.current_version AS hv
                  FROM input i
                  JOIN dispatcher.queues qd ON qd.name = i.q
                  JOIN dispatcher.handlers hd ON hd.name = i.h
            ), ins AS (
                INSERT INTO dispatcher.jobs AS j
                       (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                        state, due_at, max_attempts, max_retry_age_s, budget_started_at, run_key)
                SELECT p.k, p.fingerprint, p.q, p.t, p.h, p.hv, p.tg, p.p,
                       CASE WHEN p.effective_due <= now() THEN 'ready' ELSE 'scheduled' END,
                       p.effective_due, p.effective_ma, p.effective_mra, p.effective_due, p.rk
                  FROM prepared p ORDER BY p.o
                    ON CONFLICT (key) DO NOTHING
                RETURNING j.id, j.key, j.request_hash, j.state, j.due_at, j.created_at, j.queue,
                          j.tenant, j.handler, j.handler_version
            ), outboxed AS (
                INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
                SELECT ins.id, ins.queue, ins.tenant, ins.handler || ':' || ins.handler_version
                  FROM ins WHERE ins.state = 'ready'
            )
            SELECT p.o, coalesce(ins.id, e.id) AS job_id, p.k,
                   coalesce(ins.state, e.state) AS job_state,
                   coalesce(ins.due_at, e.due_at) AS job_due,
                   coalesce(ins.created_at, e.created_at) AS job_created,
                   CASE
                       WHEN ins.id IS NOT NULL THEN
                           CASE WHEN ins.request_hash <> p.fingerprint THEN 'conflict'
                                WHEN p.o = min(p.o) OVER (PARTITION BY p.k) THEN 'created'
                                ELSE 'existing' END
                       WHEN e.id IS NULL THEN 'retry'   -- a concurrent insert not yet visible
                       WHEN e.request_hash = p.fingerprint THEN 'existing'
                       ELSE 'conflict'
                   END AS job_outcome
              FROM prepared p
              LEFT JOIN ins ON ins.key = p.k
              LEFT JOIN LATERAL (
                   SELECT x.id, x.state, x.due_at, x.created_at, x.request_hash
                     FROM dispatcher.jobs x WHERE x.key = p.k AND ins.id IS NULL) e ON true
        LOOP
            IF rec.job_outcome = 'retry' THEN
                unresolved := unresolved || rec.o;
            ELSE
                created := created OR rec.job_outcome = 'created';
                ord := rec.o; id := rec.job_id; key := rec.k; state := rec.job_state;
                due_at := rec.job_due; created_at := rec.job_created; outcome := rec.job_outcome;
                RETURN NEXT;
            END IF;
        END LOOP;
        EXIT WHEN cardinality(unresolved) = 0;
        rounds := rounds + 1;
        IF rounds > 50 THEN
            RAISE EXCEPTION 'dispatcher.enqueue: could not resolve concurrent inserts of the same keys'
                USING ERRCODE = '40001', HINT = 'retry the transaction';
        END IF;
        pending := unresolved;
    END LOOP;

    IF created THEN
        PERFORM pg_notify('dispatcher_wake', '');
    END IF;
END
$$;

CREATE FUNCTION dispatcher.enqueue(
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
    result record;
BEGIN
    SELECT * INTO result FROM dispatcher.enqueue_many(
        ARRAY[key], ARRAY[handler], ARRAY[payload], ARRAY[due_at], ARRAY[queue], ARRAY[tenant],
        ARRAY[target], ARRAY[max_attempts], ARRAY[max_retry_age_s], ARRAY[NULL::text]);
    IF result.outcome = 'conflict' THEN
        RAISE EXCEPTION 'dispatcher.enqueue: key % already names job % with a different request', key, result.id
            USING ERRCODE = '23505',
                  HINT = 'resend the original request unchanged, or choose a new key for new work';
    END IF;
    RETURN result.id;
END
$$;
