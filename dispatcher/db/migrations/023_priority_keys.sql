-- Job priorities and concurrency keys (issue 22, points 1 and 4's storage; docs/guides/
-- priorities-and-fairness.md).
--
--   priority         smallint, -100..100, lower runs first, default 0. A claim takes the lowest
--                    value first; within one value tenants take turns; within a tenant the
--                    earliest due first.
--   concurrency_key  text of 1 to 200 characters, or NULL for no key. The doors default it to
--                    the job's tenant (NULL when the job has no tenant); the per-key limits
--                    (key_max_inflight, ...) count jobs by it.
--
-- Both live on the intent (what was asked) and are copied into the state row, where the claim
-- and the per-key limits read them, and into the outbox, where the relay orders its messages
-- by priority. The doors take them as the last arguments of dispatcher.enqueue and
-- dispatcher.enqueue_many (priority => -10, concurrency_key => 'acct-7'); at the SQL door a
-- NULL key means the default (the tenant) and '' means no key. The idempotency fingerprint
-- covers both, but only where they differ from their defaults, so every fingerprint stored
-- before this migration still matches a retry of its request.
--
-- Upgrade cost: adding the columns rewrites nothing (constant defaults; the checks are NOT
-- VALID: every existing row holds the default). Jobs not finished get their tenant as key
-- (one update of those rows); the ready-claim index and the outbox's claim index are rebuilt
-- with the priority in front (one read of the state rows and of the outbox).

ALTER TABLE dispatcher.intents
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN concurrency_key text,
    ADD CONSTRAINT intents_priority_range CHECK (priority BETWEEN -100 AND 100) NOT VALID,
    ADD CONSTRAINT intents_concurrency_key_length
        CHECK (length(concurrency_key) BETWEEN 1 AND 200) NOT VALID;
ALTER TABLE dispatcher.job_state
    ADD COLUMN priority smallint NOT NULL DEFAULT 0,
    ADD COLUMN concurrency_key text;
ALTER TABLE dispatcher.outbox
    ADD COLUMN priority smallint NOT NULL DEFAULT 0;

-- Unfinished jobs get the default key, as if accepted with it (finished ones are never claimed).
UPDATE dispatcher.job_state SET concurrency_key = tenant
 WHERE state IN ('scheduled', 'ready', 'running') AND tenant <> '';
UPDATE dispatcher.intents i SET concurrency_key = s.concurrency_key
  FROM dispatcher.job_state s
 WHERE s.id = i.id AND s.concurrency_key IS NOT NULL;

-- The claim walks ready jobs by priority, then tenant, then due time (claim_ready).
DROP INDEX dispatcher.jobs_ready_claim;
CREATE INDEX jobs_ready_claim ON dispatcher.job_state (queue, priority, tenant, due_at, id)
    WHERE state = 'ready';
-- The relay leases unpublished rows by priority, then tenant, then age (lease_outbox).
DROP INDEX dispatcher.outbox_claim;
CREATE INDEX outbox_claim ON dispatcher.outbox (queue, priority, tenant, id);

-- The idempotency fingerprint with the two new fields: version 2 (migration 005) with two more
-- parts, each left out while it holds its default (priority 0; the key equal to the tenant, or
-- NULL without one), so a request that sets neither hashes exactly as before.
CREATE FUNCTION dispatcher.request_fingerprint(
    handler text, target jsonb, payload jsonb, queue text, tenant text,
    requested_due_at timestamptz, max_attempts integer, max_retry_age_s integer,
    priority integer, concurrency_key text
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'v2:' || (hashtextextended(handler, 1)
                     # coalesce(hashtextextended(target::text, 2), 0)
                     # hashtextextended(payload::text, 3)
                     # hashtextextended(queue, 4)
                     # hashtextextended(tenant, 5)
                     # coalesce(timestamp_hash_extended(requested_due_at AT TIME ZONE 'UTC', 6), 0)
                     # coalesce(hashint4extended(max_attempts, 7), 0)
                     # coalesce(hashint4extended(max_retry_age_s, 8), 0)
                     # CASE WHEN priority = 0 THEN 0 ELSE hashint4extended(priority, 9) END
                     # CASE WHEN concurrency_key IS NOT DISTINCT FROM nullif(tenant, '') THEN 0
                            -- no key where the tenant would give one: a part of its own
                            ELSE coalesce(hashtextextended(concurrency_key, 10), 10) END)::text
$$;

-- The key a door stores: NULL asks for the default (the tenant, none without one), '' for none.
CREATE FUNCTION dispatcher.effective_concurrency_key(requested text, tenant text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN requested IS NULL THEN nullif(tenant, '') ELSE nullif(requested, '') END
$$;

-- The view gains both fields, read from the state row (where the claim reads them).
CREATE OR REPLACE VIEW dispatcher.jobs AS
SELECT i.id, i.key, i.request_hash, s.queue, i.tenant, i.handler, i.handler_version, i.target,
       i.payload, s.state, s.due_at, s.attempt, i.max_attempts, i.max_retry_age_s,
       s.budget_started_at, s.lease_owner, s.lease_expires_at, s.cancel_requested, s.progress,
       s.result, s.last_error, s.dead_reason, s.run_key, i.created_at, s.started_at,
       s.finished_at, i.dead_letter_of, i.traceparent, s.priority, s.concurrency_key
  FROM dispatcher.intents i
  JOIN dispatcher.job_state s ON s.id = i.id;

ALTER VIEW dispatcher.jobs ALTER COLUMN priority SET DEFAULT 0;

-- Writes through the view (migration 015) carry both fields to the intent and the state row.
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

-- The SQL door for one job, as in 015, with `priority` and `concurrency_key`.
DROP FUNCTION dispatcher.enqueue(text, text, jsonb, timestamptz, text, text, jsonb, integer,
                                 integer);
CREATE FUNCTION dispatcher.enqueue(
    key             text,
    handler         text,
    payload         jsonb DEFAULT '{}',
    due_at          timestamptz DEFAULT NULL,
    queue           text DEFAULT NULL,
    tenant          text DEFAULT NULL,
    target          jsonb DEFAULT NULL,
    max_attempts    integer DEFAULT NULL,
    max_retry_age_s integer DEFAULT NULL,
    priority        integer DEFAULT NULL,
    concurrency_key text DEFAULT NULL
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
    prio        integer := coalesce(priority, 0);
    ckey        text := dispatcher.effective_concurrency_key(concurrency_key, coalesce(tenant, ''));
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
    IF prio NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'dispatcher.enqueue: priority % is out of range', prio
            USING ERRCODE = '22023',
                  HINT = 'a priority is an integer from -100 to 100, lower runs first (default 0)';
    END IF;
    IF length(concurrency_key) > 200 THEN
        RAISE EXCEPTION 'dispatcher.enqueue: concurrency_key is % characters long',
            length(concurrency_key)
            USING ERRCODE = '22023',
                  HINT = 'a concurrency_key is 1 to 200 characters; NULL for the tenant, '''' for none';
    END IF;
    IF NOT (due_at <@ dispatcher.due_at_range()) THEN
        PERFORM dispatcher.refuse_due_at(due_at);
    END IF;
    IF due_at < now() - make_interval(secs => tolerance_s) THEN
        PERFORM dispatcher.refuse_past_due(due_at, tolerance_s);
    END IF;
    fingerprint := dispatcher.request_fingerprint(handler, target, payload, queue_name,
                                                  tenant_name, due_at, max_attempts,
                                                  max_retry_age_s, prio, ckey);
    FOR round IN 1..50 LOOP
        INSERT INTO dispatcher.intents AS j
               (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                max_attempts, max_retry_age_s, priority, concurrency_key)
        VALUES (key, fingerprint, queue_name, tenant_name, handler, version, target, payload,
                coalesce(max_attempts, defaults.max_attempts),
                coalesce(max_retry_age_s, defaults.max_retry_age_s), prio, ckey)
            ON CONFLICT ON CONSTRAINT jobs_key_key DO NOTHING
        RETURNING j.id INTO new_id;
        IF new_id IS NOT NULL THEN
            new_state := CASE WHEN effective <= now() THEN 'ready' ELSE 'scheduled' END;
            INSERT INTO dispatcher.job_state (id, queue, tenant, capability, state, due_at,
                                              budget_started_at, priority, concurrency_key)
            VALUES (new_id, queue_name, tenant_name, handler || ':' || version, new_state,
                    effective, greatest(effective, now()), prio, ckey);
            IF new_state = 'ready' AND dispatcher.ready_outbox() THEN
                INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
                VALUES (new_id, queue_name, tenant_name, handler || ':' || version, prio);
            END IF;
            PERFORM pg_notify('dispatcher_wake', new_state);
            RETURN new_id;
        END IF;
        SELECT j.id, j.request_hash INTO found_id, found_hash
          FROM dispatcher.jobs j WHERE j.key = enqueue.key;
        IF found_id IS NOT NULL THEN
            IF found_hash <> fingerprint AND (found_hash LIKE 'v2:%' OR prio <> 0
                   OR ckey IS DISTINCT FROM nullif(tenant_name, '') OR found_hash
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

-- The batch's worded check (018), with the two new rules.
DROP FUNCTION dispatcher.enqueue_check(text[], text[], jsonb[], text[], jsonb[], integer[],
                                       integer[]);
CREATE FUNCTION dispatcher.enqueue_check(
    keys text[], handlers text[], payloads jsonb[], queues text[], targets jsonb[],
    max_attempts integer[], max_retry_age_s integer[], priorities integer[] DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    bad text;
BEGIN
    SELECT min(CASE
               -- (not '^[ -~]{1,255}$': a bounded repeat makes the regex slow)
               WHEN u.k IS NULL OR length(u.k) NOT BETWEEN 1 AND 255 OR u.k ~ '[^ -~]' THEN
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
               WHEN u.pr NOT BETWEEN -100 AND 100 THEN
                   format('a priority is an integer from -100 to 100, lower runs first (default '
                          '0)|priority %s is out of range', u.pr)
               WHEN length(u.ck) > 200 THEN
                   format('a concurrency_key is 1 to 200 characters; NULL for the tenant, '''' '
                          'for none|concurrency_key is %s characters long', length(u.ck))
           END)
      INTO bad
      FROM unnest(keys, handlers, payloads, queues, targets, max_attempts, max_retry_age_s,
                  priorities, concurrency_keys)
           AS u(k, h, p, q, tg, ma, mra, pr, ck)
      LEFT JOIN dispatcher.queues qd ON qd.name = coalesce(u.q, 'default')
      LEFT JOIN dispatcher.handlers hd ON hd.name = u.h;
    IF bad IS NOT NULL THEN
        -- `bad` is 'hint|message': hints never contain '|', messages may (keys do)
        RAISE EXCEPTION 'dispatcher.enqueue: %', substr(bad, strpos(bad, '|') + 1)
            USING ERRCODE = '22023', HINT = split_part(bad, '|', 1);
    END IF;
END
$$;

-- The batch door (018) with `priorities` and `concurrency_keys`, one per item (NULL arrays:
-- the defaults).
DROP FUNCTION dispatcher.enqueue_many(text[], text[], jsonb[], timestamptz[], text[], text[],
                                      jsonb[], integer[], integer[], text[]);
DROP FUNCTION dispatcher.enqueue_many_internal(text[], text[], jsonb[], timestamptz[], text[],
                                               text[], jsonb[], integer[], integer[], text[]);
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
    run_keys        text[] DEFAULT NULL,
    priorities      integer[] DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL
) RETURNS SETOF dispatcher.enqueue_result
LANGUAGE plpgsql
-- a generic plan (cached after five calls) guesses ~10 items per array and goes quadratic
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    n          integer := coalesce(cardinality(keys), 0);
    ids        bigint[];           -- each item's id, drawn up front (see above)
    pending    integer[];          -- NULL = every item; else the ordinals still unresolved
    results    dispatcher.enqueue_result[];
    outbox     boolean := dispatcher.ready_outbox();
    created    integer;
    checked    boolean := false;   -- every item validated one by one
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
        PERFORM dispatcher.refuse_due_at(bad_due, bad_item);
    END IF;
    -- keys are checked for the whole array at once; a bad one is named by the full check
    IF array_position(keys, NULL) IS NOT NULL OR array_to_string(keys, '') ~ '[^ -~]' THEN
        PERFORM dispatcher.enqueue_check(keys, handlers, payloads, queues, targets, max_attempts,
                                         max_retry_age_s, priorities, concurrency_keys);
        checked := true;
    END IF;
    ids := ARRAY(SELECT nextval(pg_get_serial_sequence('dispatcher.intents', 'id')::regclass)
                   FROM generate_series(1, n));

    LOOP
        WITH ins_intent AS (
            INSERT INTO dispatcher.intents AS j
                   (id, key, request_hash, queue, tenant, handler, handler_version, target, payload,
                    max_attempts, max_retry_age_s, run_key, priority, concurrency_key)
            OVERRIDING SYSTEM VALUE
            SELECT u.id, u.k,
                   dispatcher.request_fingerprint(u.h, u.tg, u.p, coalesce(u.q, 'default'),
                                                  coalesce(u.t, ''), u.d, u.ma, u.mra,
                                                  coalesce(u.pr, 0), u.ck),
                   coalesce(u.q, 'default'), coalesce(u.t, ''), u.h, u.hv, u.tg,
                   u.p, coalesce(u.ma, u.queue_ma), coalesce(u.mra, u.queue_mra), u.rk,
                   coalesce(u.pr, 0), u.ck
              FROM (SELECT u.k, u.h, u.p, u.d, u.q, u.t, u.tg, u.ma, u.mra, u.rk, u.id, u.o,
                           u.pr,
                           dispatcher.effective_concurrency_key(u.ck, coalesce(u.t, '')) AS ck,
                           qd.max_attempts AS queue_ma, qd.max_retry_age_s AS queue_mra,
                           hd.current_version AS hv
                      FROM unnest(keys, handlers, payloads, due_ats, queues, tenants, targets,
                                  max_attempts, max_retry_age_s, run_keys, ids, priorities,
                                  concurrency_keys)
                           WITH ORDINALITY AS u(k, h, p, d, q, t, tg, ma, mra, rk, id, pr, ck, o)
                      JOIN dispatcher.queues qd ON qd.name = coalesce(u.q, 'default')
                      JOIN dispatcher.handlers hd ON hd.name = u.h
                     WHERE pending IS NULL OR u.o IN (SELECT unnest(pending))
                    -- planned for every item: the filter below would make the planner expect
                    -- a handful and probe the two registries once per item
                    OFFSET 0) u
               -- the rules enqueue_check words; an item breaking one is left out, found below
             WHERE length(u.k) BETWEEN 1 AND 255 AND jsonb_typeof(u.p) = 'object'
               AND CASE WHEN u.h = 'http' THEN jsonb_typeof(u.tg -> 'url') = 'string'
                        ELSE u.tg IS NULL END
               AND coalesce(u.ma >= 1, true) AND coalesce(u.mra >= 0, true)
               AND coalesce(u.pr BETWEEN -100 AND 100, true)
               AND coalesce(length(u.ck) <= 200, true)
             ORDER BY u.o       -- of two items with one key, the first is created
                ON CONFLICT (key) DO NOTHING
            RETURNING j.id, j.queue, j.run_key, j.tenant, j.handler || ':' || j.handler_version AS cap,
                      j.priority, j.concurrency_key
        ), ins_state AS (
            INSERT INTO dispatcher.job_state AS s (id, queue, run_key, tenant, capability, state,
                                                   due_at, budget_started_at, priority,
                                                   concurrency_key)
            SELECT n.id, n.queue, n.run_key, n.tenant, n.cap,
                   CASE WHEN coalesce(d.due, now()) <= now() THEN 'ready' ELSE 'scheduled' END,
                   coalesce(d.due, now()), greatest(d.due, now()), n.priority, n.concurrency_key
              FROM ins_intent n
              -- due now (no due_ats) needs no join
              LEFT JOIN (SELECT u.id, u.due FROM unnest(ids, due_ats) AS u(id, due)
                          WHERE due_ats IS NOT NULL) d ON d.id = n.id
            RETURNING s.id, s.queue, s.tenant, s.capability, s.state, s.priority
        ), outboxed AS (
            INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
            SELECT s.id, s.queue, s.tenant, s.capability, s.priority FROM ins_state s
             WHERE outbox AND s.state = 'ready'
        )
        SELECT count(*) INTO created FROM ins_state;
        IF created = coalesce(cardinality(pending), n) THEN
            -- every item created: its answer is what was written (created_at = now())
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
        -- Some item was not created: invalid, or its key taken (before this call, by an earlier
        -- item of it, or by a concurrent transaction). Each item is looked up.
        IF NOT checked THEN
            PERFORM dispatcher.enqueue_check(keys, handlers, payloads, queues, targets,
                                             max_attempts, max_retry_age_s, priorities,
                                             concurrency_keys);
            checked := true;
        END IF;
        results := ARRAY(
            SELECT ROW(m.o, e.id, m.k, e.state, e.due_at, e.created_at,
                       CASE
                           WHEN e.id IS NULL THEN 'retry'   -- a concurrent insert not yet visible
                           WHEN e.id = m.id THEN 'created'
                           WHEN e.request_hash = dispatcher.request_fingerprint(
                                    m.h, m.tg, m.p, m.q, m.t, m.d, m.ma, m.mra, m.pr,
                                    m.ck) THEN 'existing'
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
                           coalesce(u.pr, 0) AS pr,
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
                     FROM dispatcher.jobs x WHERE x.key = m.k OFFSET 0) e ON true);
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

-- The SQL door for batches (011), passing the two new arrays on.
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
    run_keys        text[] DEFAULT NULL,
    priorities      integer[] DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL
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
        max_retry_age_s, run_keys, priorities, concurrency_keys);
END
$$;

-- The ready jobs a claim of queue `q` takes (claim_ready), in the order it takes them: the
-- lowest priority value first; within one priority, tenants take turns; within a tenant, the
-- earliest due first. Only jobs whose capability (handler:version) is in `caps`. Each row is
-- locked (FOR UPDATE SKIP LOCKED: a concurrent claim takes other jobs).
--
-- Turns: the claim walks the tenants of a priority from where the caller's previous claim
-- stopped (`after_priority`, `after_tenant`: the last tenant it served), in name order,
-- wrapping round to the first, and takes at most `wanted` tenants, an equal share each. So
-- every tenant with ready work is reached, and a tenant waits at most ceil(tenants / wanted)
-- claims of a claimer for its turn, whatever the number of tenants (before, the walk stopped
-- at the first 1,000 names: 'zzz-last' started 7,227th of 11,001 jobs). The walk is one index
-- probe per tenant (jobs_ready_claim), so a claim costs about `wanted` probes, not one per
-- tenant with ready work.
--
-- Strict: a priority's jobs are all taken before the next priority's. Tenants that held fewer
-- than their share leave the rest of the claim to those that filled theirs (another round,
-- a new share each); only when a priority has nothing left that this claim can take does the
-- claim go on to the next priority value.
CREATE FUNCTION dispatcher.claim_pick(q text, wanted integer, caps text[],
                                      after_priority integer, after_tenant text)
RETURNS TABLE (id bigint, pos integer, priority smallint, tenant text, turn integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lvl     smallint;
    need      integer := wanted;
    taken     bigint[] := '{}';
    walked    text[];      -- the tenants of this round, in turn order
    turns     integer[];   -- their turns (positions in the walk from the cursor)
    share     integer;
    got_ids   bigint[];
    got_names text[];
    got_turns integer[];
    filled    text[];
    rounds    integer;
BEGIN
    IF wanted < 1 OR EXISTS (SELECT 1 FROM dispatcher.queues x WHERE x.name = q AND x.paused) THEN
        RETURN;  -- a paused queue offers nothing
    END IF;
    LOOP
        SELECT min(s.priority) INTO lvl FROM dispatcher.job_state s
         WHERE s.queue = q AND s.state = 'ready' AND (lvl IS NULL OR s.priority > lvl);
        EXIT WHEN lvl IS NULL;
        -- the walk: the tenants after the cursor, then from the first name round to it
        WITH RECURSIVE onward AS (
            (SELECT s.tenant FROM dispatcher.job_state s
              WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                AND (lvl IS DISTINCT FROM after_priority OR s.tenant > after_tenant)
              ORDER BY s.tenant LIMIT 1)
            UNION ALL
            SELECT n.tenant FROM onward o
             CROSS JOIN LATERAL (
                   SELECT s.tenant FROM dispatcher.job_state s
                    WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                      AND s.tenant > o.tenant
                    ORDER BY s.tenant LIMIT 1) n
        ), round_ AS (
            (SELECT s.tenant FROM dispatcher.job_state s
              WHERE lvl = after_priority AND s.queue = q AND s.state = 'ready'
                AND s.priority = lvl AND s.tenant <= after_tenant
              ORDER BY s.tenant LIMIT 1)
            UNION ALL
            SELECT n.tenant FROM round_ o
             CROSS JOIN LATERAL (
                   SELECT s.tenant FROM dispatcher.job_state s
                    WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                      AND s.tenant > o.tenant AND s.tenant <= after_tenant
                    ORDER BY s.tenant LIMIT 1) n
        )
        -- read lazily: the walk stops after `need` tenants (the append reads `onward` first)
        SELECT array_agg(w.tenant), array_agg(w.n)
          INTO walked, turns
          FROM (SELECT t.tenant, row_number() OVER ()::integer AS n
                  FROM (SELECT o.tenant FROM onward o
                        UNION ALL SELECT r.tenant FROM round_ r LIMIT need) t) w;
        rounds := 0;
        LOOP
            share := ceil(need::float8 / cardinality(walked))::integer;
            WITH picked AS (
                SELECT c.id, w.tenant, w.turn, c.rank
                  FROM unnest(walked, turns) AS w(tenant, turn)
                 CROSS JOIN LATERAL (
                       SELECT l.id, row_number() OVER (ORDER BY l.due_at, l.id) AS rank
                         FROM (SELECT s.id, s.due_at FROM dispatcher.job_state s
                                WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                                  AND s.tenant = w.tenant AND s.capability = ANY (caps)
                                  AND s.id <> ALL (taken)
                                ORDER BY s.due_at, s.id
                                LIMIT share
                                  FOR UPDATE SKIP LOCKED) l) c
            ), ordered AS (
                SELECT p.* FROM picked p ORDER BY p.rank, p.turn LIMIT need
            )
            SELECT coalesce(array_agg(o.id ORDER BY o.rank, o.turn), '{}'),
                   array_agg(o.tenant ORDER BY o.rank, o.turn),
                   array_agg(o.turn ORDER BY o.rank, o.turn),
                   (SELECT array_agg(f.tenant ORDER BY f.turn) FROM (
                        SELECT p.tenant, p.turn FROM picked p GROUP BY p.tenant, p.turn
                        HAVING count(*) = share) f)
              INTO got_ids, got_names, got_turns, filled
              FROM ordered o;
            RETURN QUERY
            SELECT g.id, (wanted - need + g.n)::integer, lvl, g.tenant, g.turn
              FROM unnest(got_ids, got_names, got_turns) WITH ORDINALITY AS g(id, tenant, turn, n);
            need := need - cardinality(got_ids);
            taken := taken || got_ids;
            IF need <= 0 THEN
                RETURN;
            END IF;
            rounds := rounds + 1;
            -- this priority is done for this claim when no tenant filled its share
            EXIT WHEN filled IS NULL OR rounds >= 8;
            walked := filled;
            turns := ARRAY(SELECT u.turn FROM unnest(got_names, got_turns) AS u(tenant, turn)
                            WHERE u.tenant = ANY (filled) GROUP BY u.tenant, u.turn
                            ORDER BY u.turn);
        END LOOP;
    END LOOP;
END
$$;

-- The relay's pick (lease_outbox): the outbox rows of queue `q` to publish next, in the order
-- claim_pick takes ready jobs (priority, then tenants in turn from the caller's cursor, then the
-- oldest row first), among the rows not published and not leased. The relay publishes them in
-- this order and a broker queue delivers in publishing order, so the priority survives the
-- broker: what the broker holds ahead of an urgent job is at most the queue's relay window.
CREATE FUNCTION dispatcher.relay_pick(q text, wanted integer, after_priority integer,
                                      after_tenant text)
RETURNS TABLE (id bigint, pos integer, priority smallint, tenant text, turn integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lvl       smallint;
    need      integer := wanted;
    taken     bigint[] := '{}';
    walked    text[];      -- the tenants of this round, in turn order
    turns     integer[];   -- their turns (positions in the walk from the cursor)
    share     integer;
    got_ids   bigint[];
    got_names text[];
    got_turns integer[];
    filled    text[];
    rounds    integer;
BEGIN
    IF wanted < 1 THEN
        RETURN;
    END IF;
    LOOP
        SELECT min(s.priority) INTO lvl FROM dispatcher.outbox s
         WHERE s.queue = q
                AND s.published_at IS NULL AND coalesce(s.leased_until < now(), true) AND (lvl IS NULL OR s.priority > lvl);
        EXIT WHEN lvl IS NULL;
        -- the walk: the tenants after the cursor, then from the first name round to it
        WITH RECURSIVE onward AS (
            (SELECT s.tenant FROM dispatcher.outbox s
              WHERE s.queue = q
                AND s.published_at IS NULL AND coalesce(s.leased_until < now(), true) AND s.priority = lvl
                AND (lvl IS DISTINCT FROM after_priority OR s.tenant > after_tenant)
              ORDER BY s.tenant LIMIT 1)
            UNION ALL
            SELECT n.tenant FROM onward o
             CROSS JOIN LATERAL (
                   SELECT s.tenant FROM dispatcher.outbox s
                    WHERE s.queue = q
                AND s.published_at IS NULL AND coalesce(s.leased_until < now(), true) AND s.priority = lvl
                      AND s.tenant > o.tenant
                    ORDER BY s.tenant LIMIT 1) n
        ), round_ AS (
            (SELECT s.tenant FROM dispatcher.outbox s
              WHERE lvl = after_priority AND s.queue = q AND s.published_at IS NULL AND (s.leased_until IS NULL OR s.leased_until < now())
                AND s.priority = lvl AND s.tenant <= after_tenant
              ORDER BY s.tenant LIMIT 1)
            UNION ALL
            SELECT n.tenant FROM round_ o
             CROSS JOIN LATERAL (
                   SELECT s.tenant FROM dispatcher.outbox s
                    WHERE s.queue = q
                AND s.published_at IS NULL AND coalesce(s.leased_until < now(), true) AND s.priority = lvl
                      AND s.tenant > o.tenant AND s.tenant <= after_tenant
                    ORDER BY s.tenant LIMIT 1) n
        )
        -- read lazily: the walk stops after `need` tenants (the append reads `onward` first)
        SELECT array_agg(w.tenant), array_agg(w.n)
          INTO walked, turns
          FROM (SELECT t.tenant, row_number() OVER ()::integer AS n
                  FROM (SELECT o.tenant FROM onward o
                        UNION ALL SELECT r.tenant FROM round_ r LIMIT need) t) w;
        rounds := 0;
        LOOP
            share := ceil(need::float8 / cardinality(walked))::integer;
            WITH picked AS (
                SELECT c.id, w.tenant, w.turn, c.rank
                  FROM unnest(walked, turns) AS w(tenant, turn)
                 CROSS JOIN LATERAL (
                       SELECT l.id, row_number() OVER (ORDER BY l.id) AS rank
                         FROM (SELECT s.id FROM dispatcher.outbox s
                                WHERE s.queue = q
                AND s.published_at IS NULL AND coalesce(s.leased_until < now(), true) AND s.priority = lvl
                                  AND s.tenant = w.tenant AND s.id <> ALL (taken)
                                ORDER BY s.id
                                LIMIT share
                                  FOR UPDATE SKIP LOCKED) l) c
            ), ordered AS (
                SELECT p.* FROM picked p ORDER BY p.rank, p.turn LIMIT need
            )
            SELECT coalesce(array_agg(o.id ORDER BY o.rank, o.turn), '{}'),
                   array_agg(o.tenant ORDER BY o.rank, o.turn),
                   array_agg(o.turn ORDER BY o.rank, o.turn),
                   (SELECT array_agg(f.tenant ORDER BY f.turn) FROM (
                        SELECT p.tenant, p.turn FROM picked p GROUP BY p.tenant, p.turn
                        HAVING count(*) = share) f)
              INTO got_ids, got_names, got_turns, filled
              FROM ordered o;
            RETURN QUERY
            SELECT g.id, (wanted - need + g.n)::integer, lvl, g.tenant, g.turn
              FROM unnest(got_ids, got_names, got_turns) WITH ORDINALITY AS g(id, tenant, turn, n);
            need := need - cardinality(got_ids);
            taken := taken || got_ids;
            IF need <= 0 THEN
                RETURN;
            END IF;
            rounds := rounds + 1;
            -- this priority is done for this claim when no tenant filled its share
            EXIT WHEN filled IS NULL OR rounds >= 8;
            walked := filled;
            turns := ARRAY(SELECT u.turn FROM unnest(got_names, got_turns) AS u(tenant, turn)
                            WHERE u.tenant = ANY (filled) GROUP BY u.tenant, u.turn
                            ORDER BY u.turn);
        END LOOP;
    END LOOP;
END
$$;
