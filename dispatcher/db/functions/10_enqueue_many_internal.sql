-- The daemon's door for batches (HTTP intake, cron units): every item checked, the valid
-- ones inserted (ON CONFLICT on the key), each item classified (created, existing, conflict),
-- in one statement. It does not check the past-due tolerance: HTTP intake does, per item.
-- A key the key ledger holds (its job was pruned: migration 029) creates nothing: the job
-- written for it is taken back, and the item answers "pruned" (the same request: the original
-- id and final state, no times) or "conflict".
-- Applications call dispatcher.enqueue_many, which checks the tolerance first.
-- Each item's `priorities` and `concurrency_keys` (NULL arrays: the defaults; migration 023).
-- `refuse_over` (the SQL door's limits.max_payload_bytes; NULL from the daemon, which checks
-- first): the call is refused as dispatcher.refuse_oversize words it when an item is over it or
-- may hold a number the daemon cannot read. The insert measures each item as it writes it
-- (size_bytes), so the items are rendered again only when the largest written calls for it,
-- or before the call is refused for another reason (that refusal came first: the door
-- checked sizes before it called here).
CREATE OR REPLACE FUNCTION dispatcher.enqueue_many_internal(
    keys            text[],
    handlers        text[],
    payloads        jsonb[],
    due_ats         timestamptz[] DEFAULT NULL,
    queues          text[] DEFAULT NULL,
    tenants         text[] DEFAULT NULL,
    targets         jsonb[] DEFAULT NULL,
    max_attempts    integer[] DEFAULT NULL,
    max_retry_age_s integer[] DEFAULT NULL,
    run_keys        text[] DEFAULT NULL,
    priorities      integer[] DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL,
    refuse_over     bigint DEFAULT NULL
) RETURNS SETOF dispatcher.enqueue_result
LANGUAGE plpgsql
-- a generic plan (cached after five calls) guesses ~10 items per array and goes quadratic
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    n          integer := coalesce(cardinality(keys), 0);
    ids        bigint[];           -- each item's id, drawn up front (see above)
    -- looked up once: inside the query below it was looked up per item (a catalog scan each),
    -- 3 of a bulk job's ~26 us of PostgreSQL CPU (measured, 2026-12-03 evening)
    id_seq     regclass := pg_get_serial_sequence('dispatcher.intents', 'id')::regclass;
    pending    integer[];          -- NULL = every item; else the ordinals still unresolved
    results    dispatcher.enqueue_result[];
    outbox     boolean := dispatcher.ready_outbox();
    created    integer;
    largest    bigint;             -- the largest size_bytes the round wrote
    sizes_checked boolean := refuse_over IS NULL;
    checked    boolean := false;   -- every item validated one by one
    bad        text;
    rounds     integer := 0;
    any_ready  boolean := false;
    any_later  boolean := false;
    bad_item   bigint;
    bad_due    timestamptz;
    taken      integer;            -- jobs of this round taken back for the key ledger
    conflicted boolean := false;   -- the first round without a conflict clause met a key taken
    taken_by   text;
    -- The insert of one round (intents, state rows, outbox rows; the answer: how many were
    -- created and the largest size written), with %s for its order and conflict clause; $1-$13 the arrays in the order of its unnest
    -- (this function's arguments, `ids` after `run_keys`), $14 pending, $15 outbox. The first round has no conflict clause: a speculative insertion per row
    -- (ON CONFLICT) cost a bulk job ~3 us of ~18 of PostgreSQL CPU (measured, 2026-12-03
    -- evening), and a new batch conflicts with nothing; a key taken makes it fail
    -- (unique_violation) and the round is written again with ON CONFLICT (key) DO NOTHING, in
    -- the items' order: of two items with one key, the first is created. A batch resent whole
    -- goes there at once (its first key is found).
    insert_round CONSTANT text := $sql$
    WITH ins_intent AS (
        INSERT INTO dispatcher.intents AS j
               (id, key, request_hash, queue, tenant, handler, handler_version, target, payload,
                max_attempts, max_retry_age_s, run_key, priority, concurrency_key, size_bytes)
        OVERRIDING SYSTEM VALUE
        SELECT u.id, u.k,
               dispatcher.request_fingerprint_text(u.h, u.tg_text, u.p_text,
                                                   coalesce(u.q, 'default'), coalesce(u.t, ''),
                                                   u.d, u.ma, u.mra, coalesce(u.pr, 0),
                                                   u.asked_ck),
               coalesce(u.q, 'default'), coalesce(u.t, ''), u.h, u.hv, u.tg,
               u.p, coalesce(u.ma, u.queue_ma), coalesce(u.mra, u.queue_mra), u.rk,
               coalesce(u.pr, 0), u.ck,
               -- what the trigger intents_size_bytes would write (dispatcher.stored_bytes),
               -- without its call per row, from the text the fingerprint hashed
               octet_length(u.p_text)::bigint + coalesce(octet_length(u.tg_text), 0)::bigint
          FROM (SELECT u.k, u.h, u.p, u.d, u.q, u.t, u.tg, u.ma, u.mra, u.rk, u.id, u.o,
                       u.pr, u.ck AS asked_ck,
                       -- each payload rendered once, for its fingerprint and its size
                       u.p::text AS p_text, u.tg::text AS tg_text,
                       dispatcher.effective_concurrency_key(u.ck, coalesce(u.t, '')) AS ck,
                       qd.name AS known_queue, qd.max_attempts AS queue_ma,
                       qd.max_retry_age_s AS queue_mra, hd.current_version AS hv
                  FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                       WITH ORDINALITY AS u(k, h, p, d, q, t, tg, ma, mra, rk, id, pr, ck, o)
                  -- outer joins, the unknown names left out below: an inner join's estimate
                  -- (an item in 200 matches: no statistics on the items) made the planner probe
                  -- the second registry's index once per item. A hash join may hand the items
                  -- over in another order, so every round sorts them (ORDER BY u.o): the rows
                  -- are written in the items' order, the ids' (the relay publishes a tenant's
                  -- outbox rows oldest first by the outbox's own id, drawn as they are written)
                  LEFT JOIN dispatcher.queues qd ON qd.name = coalesce(u.q, 'default')
                  LEFT JOIN dispatcher.handlers hd ON hd.name = u.h
                 WHERE $14 IS NULL OR u.o IN (SELECT unnest($14))
                -- planned for every item: the filter below would make the planner expect
                -- a handful and probe the two registries once per item
                OFFSET 0) u
           -- the rules enqueue_check words; an item breaking one is left out, found below
         WHERE u.known_queue IS NOT NULL AND u.hv IS NOT NULL
           AND length(u.k) BETWEEN 1 AND 255 AND jsonb_typeof(u.p) = 'object'
           AND CASE WHEN u.h = 'http' THEN jsonb_typeof(u.tg -> 'url') = 'string'
                    ELSE u.tg IS NULL END
           AND coalesce(u.ma >= 1, true) AND coalesce(u.mra >= 0, true)
           AND coalesce(u.pr BETWEEN -100 AND 100, true)
           AND coalesce(length(u.ck) <= 200, true)
         %s
        RETURNING j.id, j.queue, j.run_key, j.tenant, j.handler || ':' || j.handler_version AS cap,
                  j.priority, j.concurrency_key, j.size_bytes
    ), ins_state AS (
        INSERT INTO dispatcher.job_state AS s (id, queue, run_key, tenant, capability, state,
                                               due_at, budget_started_at, priority,
                                               concurrency_key)
        SELECT n.id, n.queue, n.run_key, n.tenant, n.cap,
               CASE WHEN coalesce(d.due, now()) <= now() THEN 'ready' ELSE 'scheduled' END,
               coalesce(d.due, now()), greatest(d.due, now()), n.priority, n.concurrency_key
          FROM ins_intent n
          -- due now (no due_ats) needs no join
          LEFT JOIN (SELECT u.id, u.due FROM unnest($11, $4) AS u(id, due)
                      WHERE $4 IS NOT NULL) d ON d.id = n.id
        RETURNING s.id, s.queue, s.tenant, s.capability, s.state, s.priority
    ), outboxed AS (
        INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority, attempt)
        SELECT s.id, s.queue, s.tenant, s.capability, s.priority, 0 FROM ins_state s
         WHERE $15 AND s.state = 'ready'
         -- the relay publishes by the outbox's id: drawn in the jobs' order, whatever order
         -- the state rows' join handed them over in (a hash join's leftovers come in its
         -- buckets' order); sorted only where an outbox is written (a relay transport)
         ORDER BY s.id
    )
    -- (every intent has its state row: ins_state runs to completion, read or not)
    SELECT count(*), max(n.size_bytes) FROM ins_intent n    $sql$;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(handlers), 0) <> n OR coalesce(cardinality(payloads), 0) <> n
       OR cardinality(due_ats) <> n OR cardinality(queues) <> n OR cardinality(tenants) <> n
       OR cardinality(targets) <> n OR cardinality(max_attempts) <> n
       OR cardinality(max_retry_age_s) <> n OR cardinality(run_keys) <> n
       OR cardinality(priorities) <> n OR cardinality(concurrency_keys) <> n THEN
        RAISE EXCEPTION 'dispatcher.enqueue_many: every array must have % elements, one per job', n
            USING ERRCODE = '22023', HINT = 'pass NULL instead of an array to use the defaults';
    END IF;
    SELECT u.o, u.d INTO bad_item, bad_due
      FROM unnest(due_ats) WITH ORDINALITY AS u(d, o)
     WHERE NOT (u.d <@ dispatcher.due_at_range())
     ORDER BY u.o
     LIMIT 1;
    IF bad_item IS NOT NULL THEN
        IF NOT sizes_checked THEN
            PERFORM dispatcher.refuse_oversize(keys, payloads, targets, refuse_over);
        END IF;
        PERFORM dispatcher.refuse_due_at(bad_due, bad_item);
    END IF;
    -- keys are checked for the whole array at once; a bad one is named by the full check
    IF array_position(keys, NULL) IS NOT NULL OR array_to_string(keys, '') ~ '[^ -~]' THEN
        IF NOT sizes_checked THEN
            PERFORM dispatcher.refuse_oversize(keys, payloads, targets, refuse_over);
            sizes_checked := true;
        END IF;
        PERFORM dispatcher.enqueue_check(keys, handlers, payloads, queues, targets, max_attempts,
                                         max_retry_age_s, priorities, concurrency_keys);
        checked := true;
    END IF;
    ids := ARRAY(SELECT nextval(id_seq) FROM generate_series(1, n));

    LOOP
        IF pending IS NULL AND NOT conflicted THEN
            conflicted := EXISTS (SELECT 1 FROM dispatcher.intents x WHERE x.key = keys[1]);
        END IF;
        IF pending IS NULL AND NOT conflicted THEN
            BEGIN
                EXECUTE format(insert_round, 'ORDER BY u.o') INTO created, largest
                  USING keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
                        max_retry_age_s, run_keys, ids, priorities, concurrency_keys, pending,
                        outbox;
            EXCEPTION WHEN unique_violation THEN
                GET STACKED DIAGNOSTICS taken_by = CONSTRAINT_NAME;
                IF taken_by IS DISTINCT FROM 'jobs_key_prefix_id' THEN
                    RAISE;
                END IF;
                conflicted := true;  -- nothing of the round is left: written again below
            END;
        END IF;
        IF pending IS NOT NULL OR conflicted THEN
            EXECUTE format(insert_round, 'ORDER BY u.o ON CONFLICT (key) DO NOTHING') INTO created, largest
              USING keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
                    max_retry_age_s, run_keys, ids, priorities, concurrency_keys, pending, outbox;
        END IF;
        -- after the insert, not before: an insert that waited on a row being pruned proceeds
        -- only once the pruner committed, its ledger row with it (one probe per job)
        -- (a cached probe per key first: take_back_pruned is planned anew on every call)
        -- (and none when the ledger is empty, as until the first pruning: the probe of 10,000
        -- keys sorts them first, 6 ms and 1 ms of planning of a call's 130; a statement of its
        -- own, or the probe is planned, 1 ms, even when the ledger is empty)
        taken := 0;
        IF EXISTS (SELECT 1 FROM dispatcher.key_ledger) THEN
            IF EXISTS (SELECT 1 FROM dispatcher.key_ledger x WHERE x.key = ANY (keys)) THEN
                SELECT count(*) INTO taken FROM dispatcher.take_back_pruned(ids, keys);
            END IF;
        END IF;
        IF created = coalesce(cardinality(pending), n) AND taken = 0 THEN
            -- every item created: its answer is what was written (created_at = now())
            IF NOT sizes_checked AND largest > least(4300, refuse_over) THEN
                PERFORM dispatcher.refuse_oversize(keys, payloads, targets, refuse_over);
            END IF;
            RETURN QUERY
            SELECT u.o::integer, u.id, u.k,
                   CASE WHEN coalesce(u.d, now()) <= now() THEN 'ready' ELSE 'scheduled' END,
                   coalesce(u.d, now()), now(), 'created'::text
              FROM unnest(keys, due_ats, ids) WITH ORDINALITY AS u(k, d, id, o)
             WHERE pending IS NULL OR u.o IN (SELECT unnest(pending));
            any_ready := any_ready OR due_ats IS NULL OR EXISTS (
                SELECT 1 FROM unnest(due_ats) WITH ORDINALITY AS u(d, o)
                 WHERE (pending IS NULL OR u.o IN (SELECT unnest(pending)))
                   AND (u.d IS NULL OR u.d <= now()));
            any_later := any_later OR EXISTS (
                SELECT 1 FROM unnest(due_ats) WITH ORDINALITY AS u(d, o)
                 WHERE (pending IS NULL OR u.o IN (SELECT unnest(pending))) AND u.d > now());
            EXIT;
        END IF;
        -- Some item was not created: invalid, its key taken (before this call, by an earlier
        -- item of it, or by a concurrent transaction) or kept by the key ledger. Each item is
        -- looked up: a key without a job, in the ledger.
        IF NOT sizes_checked THEN
            PERFORM dispatcher.refuse_oversize(keys, payloads, targets, refuse_over);
            sizes_checked := true;
        END IF;
        IF NOT checked THEN
            PERFORM dispatcher.enqueue_check(keys, handlers, payloads, queues, targets,
                                             max_attempts, max_retry_age_s, priorities,
                                             concurrency_keys);
            checked := true;
        END IF;
        results := ARRAY(
            SELECT ROW(m.o, coalesce(e.id, g.job_id), m.k, coalesce(e.state, g.state), e.due_at,
                       e.created_at,
                       CASE
                           WHEN e.id IS NULL AND g.job_id IS NOT NULL THEN
                               CASE WHEN g.request_hash NOT LIKE 'v2:%' OR g.request_hash
                                         = dispatcher.request_fingerprint(m.h, m.tg, m.p, m.q,
                                                                          m.t, m.d, m.ma, m.mra,
                                                                          m.pr, m.asked_ck)
                                    THEN 'pruned' ELSE 'conflict' END
                           WHEN e.id IS NULL THEN 'retry'   -- a concurrent insert not yet visible
                           WHEN e.id = m.id THEN 'created'
                           WHEN e.request_hash = dispatcher.request_fingerprint(
                                    m.h, m.tg, m.p, m.q, m.t, m.d, m.ma, m.mra, m.pr,
                                    m.asked_ck) THEN 'existing'
                           -- a job accepted before migration 005 carries an md5 fingerprint
                           -- (and was asked with the default priority and key)
                           WHEN e.request_hash NOT LIKE 'v2:%' AND m.pr = 0
                                AND m.ck IS NOT DISTINCT FROM nullif(m.t, '') AND e.request_hash
                                = dispatcher.request_hash(m.h, m.tg, m.p, m.q, m.t, m.d, m.ma,
                                                          m.mra) THEN 'existing'
                           ELSE 'conflict'
                       END)::dispatcher.enqueue_result
              FROM (SELECT u.o::integer AS o, u.id, u.k, u.h, u.p, u.d, u.tg, u.ma, u.mra,
                           coalesce(u.q, 'default') AS q, coalesce(u.t, '') AS t,
                           coalesce(u.pr, 0) AS pr, u.ck AS asked_ck,
                           dispatcher.effective_concurrency_key(u.ck, coalesce(u.t, '')) AS ck
                      FROM unnest(keys, handlers, payloads, due_ats, queues, tenants, targets,
                                  max_attempts, max_retry_age_s, ids, priorities,
                                  concurrency_keys)
                           WITH ORDINALITY AS u(k, h, p, d, q, t, tg, ma, mra, id, pr, ck, o)
                     WHERE pending IS NULL OR u.o IN (SELECT unnest(pending))) m
              -- OFFSET 0 keeps this a per-item index probe: flattened, the planner may
              -- hash-join a sequential scan of the whole table instead
              LEFT JOIN LATERAL (
                   SELECT x.id, x.state, x.due_at, x.created_at, x.request_hash
                     FROM dispatcher.jobs x WHERE x.key = m.k OFFSET 0) e ON true
              LEFT JOIN LATERAL (
                   SELECT l.job_id, l.state, l.request_hash FROM dispatcher.key_ledger l
                    WHERE e.id IS NULL AND l.key = m.k OFFSET 0) g ON true);
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
        PERFORM dispatcher.wake('ready');
    END IF;
    IF any_later THEN
        PERFORM dispatcher.wake('scheduled');
    END IF;
END
$$;
