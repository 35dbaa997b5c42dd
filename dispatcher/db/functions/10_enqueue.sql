-- The SQL door for one job, written lean because applications call it once per business
-- change: the same checks and idempotency rules as enqueue_many, without its batch machinery.
-- It refuses a due time out of range or long past; the retry budget starts at
-- greatest(due, now()); it writes the intent and its state row (and an outbox row while a
-- relay reads them), and wakes the listeners. It refuses a payload and target over
-- limits.max_payload_bytes (54000), and answers a key the key ledger holds with the pruned
-- job's id (or a conflict) instead of creating a job (migration 029). `priority` (-100..100,
-- default 0) and `concurrency_key` (NULL: the tenant; '': no key) are stored on the intent and
-- the state row (migration 023). `timeout_s`, `expires_at`, `on_success` and `on_failure` are
-- the job's contract (migration 030): a deadline of at most the handler's, a time to live, and
-- callback targets; another contract under the same key is a conflict. `on_key` and
-- `debounce_max_s` (migration 032): when the key names a job with another request, `replace`
-- or `keep_due` replace it while it is scheduled (dispatcher.replace_scheduled), and the id is
-- returned; a job already ready, running or finished is never replaced: 23505 names its state.
CREATE OR REPLACE FUNCTION dispatcher.enqueue(
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
    concurrency_key text DEFAULT NULL,
    timeout_s       float8 DEFAULT NULL,
    expires_at      timestamptz DEFAULT NULL,
    on_success      jsonb DEFAULT NULL,
    on_failure      jsonb DEFAULT NULL,
    on_key          text DEFAULT NULL,
    debounce_max_s  integer DEFAULT NULL
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
    relayed     boolean := false;  -- a ready job with an outbox row (RabbitMQ)
    found_id    bigint;
    found_hash  text;
    tolerance_s float8 := dispatcher.due_at_past_tolerance_s();
    prio        integer := coalesce(priority, 0);
    ckey        text := dispatcher.effective_concurrency_key(concurrency_key, coalesce(tenant, ''));
    max_bytes   bigint := dispatcher.max_payload_bytes();
    size        bigint;
    digits      text;
    pruned      record;
    replacing   boolean := false;
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
    size := dispatcher.payload_oversize(payload, target, max_bytes);
    IF size IS NOT NULL THEN
        PERFORM dispatcher.refuse_payload(key, size, max_bytes);
    END IF;
    IF dispatcher.stored_bytes(payload, target) > 4300 THEN
        digits := dispatcher.long_integer(payload, target);
        IF digits IS NOT NULL THEN
            PERFORM dispatcher.refuse_long_integer(key, digits);
        END IF;
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
    IF num_nonnulls(timeout_s, expires_at, on_success, on_failure, on_key, debounce_max_s) > 0 THEN
        PERFORM dispatcher.refuse_contract(handler, due_at, timeout_s, expires_at, on_success,
                                           on_failure, on_key, debounce_max_s);
    END IF;
    IF due_at < now() - make_interval(secs => tolerance_s) THEN
        PERFORM dispatcher.refuse_past_due(due_at, tolerance_s);
    END IF;
    fingerprint := dispatcher.request_fingerprint(handler, target, payload, queue_name,
                                                  tenant_name, due_at, max_attempts,
                                                  max_retry_age_s, prio, concurrency_key);
    FOR round IN 1..50 LOOP
        INSERT INTO dispatcher.intents AS j
               (key, request_hash, queue, tenant, handler, handler_version, target, payload,
                max_attempts, max_retry_age_s, priority, concurrency_key, size_bytes)
        VALUES (key, fingerprint, queue_name, tenant_name, handler, version, target, payload,
                coalesce(max_attempts, defaults.max_attempts),
                coalesce(max_retry_age_s, defaults.max_retry_age_s), prio, ckey,
                -- what the trigger intents_size_bytes would write, without its call
                dispatcher.stored_bytes(payload, target))
            -- the key's unique index (migration 046), qualified: `key` alone is the parameter here
            ON CONFLICT ((j.key)) DO NOTHING
        RETURNING j.id INTO new_id;
        IF new_id IS NOT NULL THEN
            -- one cached index probe first: the ledger almost never holds a new job's key, and
            -- take_back_pruned (three deletes) is planned anew on every call
            IF EXISTS (SELECT 1 FROM dispatcher.key_ledger x WHERE x.key = enqueue.key) THEN
                SELECT * INTO pruned FROM dispatcher.take_back_pruned(ARRAY[new_id], ARRAY[key]);
                IF pruned.job_id IS NOT NULL THEN
                    IF NOT pruned.same THEN
                        RAISE EXCEPTION 'dispatcher.enqueue: key % named job % (%, since pruned) with a different request',
                            key, pruned.job_id, pruned.state
                            USING ERRCODE = '23505',
                                  HINT = 'choose a new key for new work (a key is kept for the daemon''s retention.keys_s after its job is pruned)';
                    END IF;
                    RETURN pruned.job_id;  -- the same request: the job ran, and is not run again
                END IF;
            END IF;
            new_state := CASE WHEN effective <= now() THEN 'ready' ELSE 'scheduled' END;
            INSERT INTO dispatcher.job_state (id, queue, tenant, capability, state, due_at,
                                              budget_started_at, priority, concurrency_key)
            VALUES (new_id, queue_name, tenant_name, handler || ':' || version, new_state,
                    effective, greatest(effective, now()), prio, ckey);
            IF new_state = 'ready' AND dispatcher.ready_outbox() THEN
                INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority,
                                               attempt)
                VALUES (new_id, queue_name, tenant_name, handler || ':' || version, prio, 0);
                relayed := true;
            END IF;
            IF num_nonnulls(timeout_s, expires_at, on_success, on_failure) > 0 THEN
                UPDATE dispatcher.intents i
                   SET timeout_s = enqueue.timeout_s, on_success = enqueue.on_success,
                       on_failure = enqueue.on_failure
                 WHERE i.id = new_id;
                UPDATE dispatcher.job_state s
                   SET expires_at = enqueue.expires_at,
                       has_callback = num_nonnulls(enqueue.on_success, enqueue.on_failure) > 0
                 WHERE s.id = new_id;
            END IF;
            IF relayed THEN  -- an idle relay waits for ready work: any daemon
                PERFORM dispatcher.wake('ready');
            ELSIF new_state = 'ready' THEN  -- only while a claim loop of the queue waits
                PERFORM dispatcher.wake_queue(queue_name);
            ELSE  -- a new due time: only while a daemon listens
                PERFORM dispatcher.wake('scheduled');
            END IF;
            RETURN new_id;
        END IF;
        SELECT j.id, j.request_hash INTO found_id, found_hash
          FROM dispatcher.jobs j WHERE j.key = enqueue.key;
        IF found_id IS NOT NULL THEN
            IF found_hash <> fingerprint AND (found_hash LIKE 'v2:%' OR prio <> 0
                   OR ckey IS DISTINCT FROM nullif(tenant_name, '') OR found_hash
                   <> dispatcher.request_hash(handler, target, payload, queue_name, tenant_name,
                                              due_at, max_attempts, max_retry_age_s)) THEN
                IF coalesce(on_key, 'reject') = 'reject' THEN
                    RAISE EXCEPTION 'dispatcher.enqueue: key % already names job % with a different request',
                        key, found_id
                        USING ERRCODE = '23505',
                              HINT = 'resend the original request unchanged, or choose a new key for new work';
                END IF;
                replacing := true;
            ELSIF EXISTS (SELECT 1 FROM dispatcher.intents i JOIN dispatcher.job_state s ON s.id = i.id
                        WHERE i.id = found_id
                          AND (i.timeout_s, s.expires_at, i.on_success, i.on_failure)
                              IS DISTINCT FROM (enqueue.timeout_s, enqueue.expires_at,
                                                enqueue.on_success, enqueue.on_failure)) THEN
                IF coalesce(on_key, 'reject') = 'reject' THEN
                    RAISE EXCEPTION 'dispatcher.enqueue: key % already names job % with a different contract',
                        key, found_id
                        USING ERRCODE = '23505',
                              HINT = 'resend the original timeout_s, expires_at, on_success and on_failure, or choose a new key';
                END IF;
                replacing := true;
            END IF;
            IF replacing THEN  -- on_key replace or keep_due: the scheduled job takes this request
                RETURN dispatcher.replace_one(key, handler, payload, due_at, queue, tenant, target,
                                              max_attempts, max_retry_age_s, priority,
                                              concurrency_key, timeout_s, expires_at, on_success,
                                              on_failure, on_key, debounce_max_s);
            END IF;
            RETURN found_id;
        END IF;
        -- the conflicting insert was rolled back, or is not visible to this snapshot yet: retry
    END LOOP;
    RAISE EXCEPTION 'dispatcher.enqueue: could not resolve concurrent inserts of key %', key
        USING ERRCODE = '40001', HINT = 'retry the transaction';
END
$$;
