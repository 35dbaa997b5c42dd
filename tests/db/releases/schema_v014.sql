-- The dispatcher schema as release 0.1.0 of the old layout (every body in its migration) left
-- it at migration 014, before the job state split: made with that tree's migrate(upto=14) and
-- pg_dump -n dispatcher --inserts (PostgreSQL 15). Test data for tests/db/test_schema_upgrade.py:
-- a database an earlier release created, upgraded in place. Not a source of any current body.

--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: dispatcher; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA dispatcher;


--
-- Name: enqueue_result; Type: TYPE; Schema: dispatcher; Owner: -
--

CREATE TYPE dispatcher.enqueue_result AS (
	ord integer,
	id bigint,
	key text,
	state text,
	due_at timestamp with time zone,
	created_at timestamp with time zone,
	outcome text
);


--
-- Name: claim_grant(text, integer); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.claim_grant(q text, wanted integer, OUT granted integer, OUT wait_s double precision) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    r       dispatcher.queues;
    at      timestamptz;
    avail   float8;
    running integer := 0;
BEGIN
    granted := greatest(wanted, 0);
    SELECT * INTO r FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR (r.rate_per_s IS NULL AND r.max_inflight IS NULL) THEN
        RETURN;  -- unlimited: no lock, claims of this queue run in parallel
    END IF;
    SELECT * INTO r FROM dispatcher.queues WHERE name = q FOR UPDATE;
    -- the clock read after the lock; never behind the last refill, so tokens never repeat
    at := greatest(r.tokens_at, clock_timestamp());
    IF r.rate_per_s IS NOT NULL THEN
        avail := least(r.burst, r.tokens
                       + extract(epoch FROM at - r.tokens_at) * r.rate_per_s);
        granted := least(granted, floor(avail)::integer);
        IF granted < 1 THEN
            wait_s := (1 - avail) / r.rate_per_s;
        END IF;
    END IF;
    IF r.max_inflight IS NOT NULL AND granted > 0 THEN
        SELECT count(*) INTO running FROM (
            SELECT 1 FROM dispatcher.jobs
             WHERE queue = q AND state = 'running' LIMIT r.max_inflight) j;
        granted := greatest(0, least(granted, r.max_inflight - running));
        IF granted < 1 AND wanted > 0 THEN
            -- full across all daemons: a slot frees when any of them completes a job, which
            -- no wake-up tells us about, so look again soon (one short statement)
            wait_s := 0.02;
        END IF;
    END IF;
    IF r.rate_per_s IS NOT NULL THEN
        UPDATE dispatcher.queues SET tokens = avail - granted, tokens_at = at WHERE name = q;
    END IF;
END
$$;


--
-- Name: claim_settle(text, integer, integer, double precision); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.claim_settle(q text, granted integer, started integer, wait_s double precision) RETURNS double precision
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF granted > started THEN
        UPDATE dispatcher.queues
           SET tokens = least(burst, tokens + (granted - started))
         WHERE name = q AND rate_per_s IS NOT NULL;
    END IF;
    RETURN wait_s;
END
$$;


--
-- Name: dead_letter_notice(); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.dead_letter_notice() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    origin   dispatcher.queues;
    notice_q dispatcher.queues;
    version  integer;
    died_at  timestamptz := coalesce(NEW.finished_at, now());
    body     jsonb;
    notice   text;
    new_id   bigint;
BEGIN
    IF NEW.dead_letter_of IS NOT NULL THEN
        RETURN NULL;  -- a notification that died: visible as a dead letter, never notified
    END IF;
    SELECT * INTO origin FROM dispatcher.queues q WHERE q.name = NEW.queue;
    IF origin.on_dead_target IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO notice_q FROM dispatcher.queues q
     WHERE q.name = coalesce(origin.on_dead_queue, NEW.queue);
    IF notice_q.name IS NULL THEN
        notice_q := origin;
    END IF;
    SELECT h.current_version INTO version FROM dispatcher.handlers h WHERE h.name = 'http';
    -- One notification per death: a job dies at most once per attempt budget, and the key
    -- carries the moment it died, so a job redriven and dead again is reported again.
    notice := format('dead-letter:%s:%s', NEW.id,
                     to_char(died_at AT TIME ZONE 'UTC', 'YYYYMMDD"T"HH24MISS.US"Z"'));
    body := jsonb_build_object(
        'type', 'job.dead',
        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', jsonb_build_object(
            'id', NEW.id, 'key', NEW.key, 'queue', NEW.queue, 'tenant', nullif(NEW.tenant, ''),
            'handler', NEW.handler, 'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
            'reason', NEW.dead_reason, 'last_error', NEW.last_error, 'run_key', NEW.run_key,
            'died_at', to_char(died_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')));
    INSERT INTO dispatcher.jobs AS j
           (key, request_hash, queue, tenant, handler, handler_version, target, payload, state,
            due_at, max_attempts, max_retry_age_s, budget_started_at, dead_letter_of)
    VALUES (notice,
            dispatcher.request_fingerprint('http', origin.on_dead_target, body, notice_q.name,
                                           NEW.tenant, NULL, NULL, NULL),
            notice_q.name, NEW.tenant, 'http', coalesce(version, 1), origin.on_dead_target, body,
            'ready', now(), notice_q.max_attempts, notice_q.max_retry_age_s, now(), NEW.id)
        ON CONFLICT (key) DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NOT NULL THEN
        INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
        VALUES (new_id, notice_q.name, NEW.tenant, 'http:' || coalesce(version, 1));
        PERFORM pg_notify('dispatcher_wake', 'ready');
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: due_at_past_tolerance_s(); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.due_at_past_tolerance_s() RETURNS double precision
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT coalesce((SELECT s.due_at_past_tolerance_s FROM dispatcher.intake_settings s), 300)
$$;


--
-- Name: due_at_range(); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.due_at_range() RETURNS tstzrange
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT tstzrange('2000-01-01 00:00:00+00', '9999-12-31 23:59:59+00', '[]')
$$;


--
-- Name: enqueue(text, text, jsonb, timestamp with time zone, text, text, jsonb, integer, integer); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.enqueue(key text, handler text, payload jsonb DEFAULT '{}'::jsonb, due_at timestamp with time zone DEFAULT NULL::timestamp with time zone, queue text DEFAULT NULL::text, tenant text DEFAULT NULL::text, target jsonb DEFAULT NULL::jsonb, max_attempts integer DEFAULT NULL::integer, max_retry_age_s integer DEFAULT NULL::integer) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: enqueue_many(text[], text[], jsonb[], timestamp with time zone[], text[], text[], jsonb[], integer[], integer[], text[]); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.enqueue_many(keys text[], handlers text[], payloads jsonb[], due_ats timestamp with time zone[] DEFAULT NULL::timestamp with time zone[], queues text[] DEFAULT NULL::text[], tenants text[] DEFAULT NULL::text[], targets jsonb[] DEFAULT NULL::jsonb[], max_attempts integer[] DEFAULT NULL::integer[], max_retry_age_s integer[] DEFAULT NULL::integer[], run_keys text[] DEFAULT NULL::text[]) RETURNS SETOF dispatcher.enqueue_result
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


--
-- Name: enqueue_many_internal(text[], text[], jsonb[], timestamp with time zone[], text[], text[], jsonb[], integer[], integer[], text[]); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.enqueue_many_internal(keys text[], handlers text[], payloads jsonb[], due_ats timestamp with time zone[] DEFAULT NULL::timestamp with time zone[], queues text[] DEFAULT NULL::text[], tenants text[] DEFAULT NULL::text[], targets jsonb[] DEFAULT NULL::jsonb[], max_attempts integer[] DEFAULT NULL::integer[], max_retry_age_s integer[] DEFAULT NULL::integer[], run_keys text[] DEFAULT NULL::text[]) RETURNS SETOF dispatcher.enqueue_result
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    AS $_$
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
$_$;


--
-- Name: refuse_due_at(timestamp with time zone, bigint); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.refuse_due_at(due timestamp with time zone, item bigint DEFAULT NULL::bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: refuse_past_due(timestamp with time zone, double precision, bigint); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.refuse_past_due(due timestamp with time zone, tolerance_s double precision, item bigint DEFAULT NULL::bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: request_fingerprint(text, jsonb, jsonb, text, text, timestamp with time zone, integer, integer); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.request_fingerprint(handler text, target jsonb, payload jsonb, queue text, tenant text, requested_due_at timestamp with time zone, max_attempts integer, max_retry_age_s integer) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT 'v2:' || (hashtextextended(handler, 1)
                     # coalesce(hashtextextended(target::text, 2), 0)
                     # hashtextextended(payload::text, 3)
                     # hashtextextended(queue, 4)
                     # hashtextextended(tenant, 5)
                     # coalesce(timestamp_hash_extended(requested_due_at AT TIME ZONE 'UTC', 6), 0)
                     # coalesce(hashint4extended(max_attempts, 7), 0)
                     # coalesce(hashint4extended(max_retry_age_s, 8), 0))::text
$$;


--
-- Name: request_hash(text, jsonb, jsonb, text, text, timestamp with time zone, integer, integer); Type: FUNCTION; Schema: dispatcher; Owner: -
--

CREATE FUNCTION dispatcher.request_hash(handler text, target jsonb, payload jsonb, queue text, tenant text, requested_due_at timestamp with time zone, max_attempts integer, max_retry_age_s integer) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT md5(jsonb_build_array(handler, target, payload, queue, tenant,
                                 extract(epoch FROM requested_due_at),
                                 max_attempts, max_retry_age_s)::text)
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: attempts; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.attempts (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    owner text NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    reason text,
    http_status integer,
    latency_s double precision,
    excerpt text,
    CONSTRAINT attempts_outcome_check CHECK ((outcome = ANY (ARRAY['succeeded'::text, 'retried'::text, 'dead'::text, 'cancelled'::text, 'lease_expired'::text, 'released'::text])))
);


--
-- Name: attempts_id_seq; Type: SEQUENCE; Schema: dispatcher; Owner: -
--

ALTER TABLE dispatcher.attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME dispatcher.attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: handlers; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.handlers (
    name text NOT NULL,
    kind text NOT NULL,
    current_version integer DEFAULT 1 NOT NULL,
    CONSTRAINT handlers_current_version_check CHECK ((current_version >= 1)),
    CONSTRAINT handlers_kind_check CHECK ((kind = ANY (ARRAY['http'::text, 'sql'::text, 'python'::text])))
);


--
-- Name: intake_settings; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.intake_settings (
    singleton boolean DEFAULT true NOT NULL,
    due_at_past_tolerance_s double precision DEFAULT 300 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT intake_settings_due_at_past_tolerance_s_check CHECK (((due_at_past_tolerance_s >= (0)::double precision) AND (due_at_past_tolerance_s <= (315360000)::double precision))),
    CONSTRAINT intake_settings_singleton_check CHECK (singleton)
);


--
-- Name: jobs; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.jobs (
    id bigint NOT NULL,
    key text NOT NULL,
    request_hash text NOT NULL,
    queue text NOT NULL,
    tenant text DEFAULT ''::text NOT NULL,
    handler text NOT NULL,
    handler_version integer DEFAULT 1 NOT NULL,
    target jsonb,
    payload jsonb NOT NULL,
    state text NOT NULL,
    due_at timestamp with time zone NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    max_retry_age_s integer NOT NULL,
    budget_started_at timestamp with time zone NOT NULL,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    cancel_requested boolean DEFAULT false NOT NULL,
    progress jsonb,
    result jsonb,
    last_error text,
    dead_reason text,
    run_key text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    dead_letter_of bigint,
    traceparent text,
    CONSTRAINT jobs_check CHECK (((state = 'running'::text) = (lease_owner IS NOT NULL))),
    CONSTRAINT jobs_key_check CHECK (((length(key) >= 1) AND (length(key) <= 255))),
    CONSTRAINT jobs_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_max_retry_age_s_check CHECK ((max_retry_age_s >= 0)),
    CONSTRAINT jobs_payload_check CHECK ((jsonb_typeof(payload) = 'object'::text))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_analyze_scale_factor='0.02');


--
-- Name: jobs_id_seq; Type: SEQUENCE; Schema: dispatcher; Owner: -
--

ALTER TABLE dispatcher.jobs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME dispatcher.jobs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: migrations; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: missed_periods; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.missed_periods (
    schedule text NOT NULL,
    period_start timestamp with time zone NOT NULL,
    reason text NOT NULL,
    detected_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT missed_periods_reason_check CHECK ((reason = ANY (ARRAY['not_fired'::text, 'disabled'::text, 'coalesced'::text, 'paused'::text])))
);


--
-- Name: outbox; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.outbox (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    queue text NOT NULL,
    tenant text NOT NULL,
    capability text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    leased_until timestamp with time zone
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='5000');


--
-- Name: outbox_id_seq; Type: SEQUENCE; Schema: dispatcher; Owner: -
--

ALTER TABLE dispatcher.outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME dispatcher.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: queues; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.queues (
    name text NOT NULL,
    max_attempts integer NOT NULL,
    max_retry_age_s integer NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    paused_at timestamp with time zone,
    on_dead_target jsonb,
    on_dead_queue text,
    rate_per_s double precision,
    burst integer,
    max_inflight integer,
    tokens double precision DEFAULT 0 NOT NULL,
    tokens_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT queues_burst_check CHECK ((burst >= 1)),
    CONSTRAINT queues_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT queues_max_inflight_check CHECK ((max_inflight >= 1)),
    CONSTRAINT queues_max_retry_age_s_check CHECK ((max_retry_age_s >= 0)),
    CONSTRAINT queues_paused_at CHECK ((paused = (paused_at IS NOT NULL))),
    CONSTRAINT queues_rate_per_s_check CHECK ((rate_per_s > (0)::double precision))
);


--
-- Name: runs; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.runs (
    run_key text NOT NULL,
    schedule text NOT NULL,
    period_start timestamp with time zone NOT NULL,
    via text NOT NULL,
    unit_count integer NOT NULL,
    overlap_decision text NOT NULL,
    overlap_with text,
    queued_jobs jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    released_at timestamp with time zone,
    finished_at timestamp with time zone,
    succeeded integer,
    dead integer,
    cancelled integer,
    discarded integer,
    CONSTRAINT runs_check CHECK (((released_at IS NULL) = (queued_jobs IS NOT NULL))),
    CONSTRAINT runs_check1 CHECK (((finished_at IS NULL) OR (released_at IS NOT NULL))),
    CONSTRAINT runs_overlap_decision_check CHECK ((overlap_decision = ANY (ARRAY['none'::text, 'allowed'::text, 'skipped'::text, 'queued'::text]))),
    CONSTRAINT runs_run_key_check CHECK (((length(run_key) >= 1) AND (length(run_key) <= 150))),
    CONSTRAINT runs_unit_count_check CHECK ((unit_count >= 0)),
    CONSTRAINT runs_via_check CHECK ((via = ANY (ARRAY['cron'::text, 'catch_up'::text, 'api'::text])))
);


--
-- Name: run_receipts; Type: VIEW; Schema: dispatcher; Owner: -
--

CREATE VIEW dispatcher.run_receipts AS
 SELECT r.run_key,
    r.schedule,
    r.period_start,
    r.via,
    r.unit_count,
    r.overlap_decision,
    r.overlap_with,
    r.created_at,
    r.released_at,
    r.finished_at,
        CASE
            WHEN u.pruned THEN r.succeeded
            ELSE u.succeeded
        END AS succeeded,
        CASE
            WHEN u.pruned THEN r.dead
            ELSE u.dead
        END AS dead,
        CASE
            WHEN u.pruned THEN r.cancelled
            ELSE u.cancelled
        END AS cancelled,
        CASE
            WHEN u.pruned THEN COALESCE(r.discarded, 0)
            ELSE u.discarded
        END AS discarded
   FROM (dispatcher.runs r
     CROSS JOIN LATERAL ( SELECT (count(*))::integer AS total,
            (count(*) FILTER (WHERE (j.state = 'succeeded'::text)))::integer AS succeeded,
            (count(*) FILTER (WHERE (j.state = 'dead'::text)))::integer AS dead,
            (count(*) FILTER (WHERE (j.state = 'cancelled'::text)))::integer AS cancelled,
            (count(*) FILTER (WHERE (j.state = 'discarded'::text)))::integer AS discarded,
            ((r.finished_at IS NOT NULL) AND (r.succeeded IS NOT NULL) AND (count(*) < r.unit_count)) AS pruned
           FROM dispatcher.jobs j
          WHERE (j.run_key = r.run_key)) u);


--
-- Name: schedule_state; Type: TABLE; Schema: dispatcher; Owner: -
--

CREATE TABLE dispatcher.schedule_state (
    schedule text NOT NULL,
    enabled boolean NOT NULL,
    tracked_since timestamp with time zone DEFAULT now() NOT NULL,
    checked_through timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    paused_at timestamp with time zone,
    CONSTRAINT schedule_state_paused_at CHECK ((paused = (paused_at IS NOT NULL)))
);


--
-- Data for Name: attempts; Type: TABLE DATA; Schema: dispatcher; Owner: -
--



--
-- Data for Name: handlers; Type: TABLE DATA; Schema: dispatcher; Owner: -
--

INSERT INTO dispatcher.handlers VALUES ('http', 'http', 1);


--
-- Data for Name: intake_settings; Type: TABLE DATA; Schema: dispatcher; Owner: -
--

INSERT INTO dispatcher.intake_settings VALUES (true, 300, '2026-12-02 13:35:11.59125+00');


--
-- Data for Name: jobs; Type: TABLE DATA; Schema: dispatcher; Owner: -
--



--
-- Data for Name: migrations; Type: TABLE DATA; Schema: dispatcher; Owner: -
--

INSERT INTO dispatcher.migrations VALUES (1, '001_jobs.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (2, '002_enqueue.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (3, '003_cron.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (4, '004_vacuum.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (5, '005_fingerprint.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (6, '006_finite_due_times.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (7, '007_operator_control.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (8, '008_attempts.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (9, '009_list_filters.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (10, '010_schedule_control.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (11, '011_sql_door_past_due.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (12, '012_traceparent.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (13, '013_global_limits.sql', '2026-12-02 13:35:11.59125+00');
INSERT INTO dispatcher.migrations VALUES (14, '014_outbox_relay.sql', '2026-12-02 13:35:11.59125+00');


--
-- Data for Name: missed_periods; Type: TABLE DATA; Schema: dispatcher; Owner: -
--



--
-- Data for Name: outbox; Type: TABLE DATA; Schema: dispatcher; Owner: -
--



--
-- Data for Name: queues; Type: TABLE DATA; Schema: dispatcher; Owner: -
--

INSERT INTO dispatcher.queues VALUES ('default', 10, 86400, false, NULL, NULL, NULL, NULL, NULL, NULL, 0, '2026-12-02 13:35:11.59125+00');


--
-- Data for Name: runs; Type: TABLE DATA; Schema: dispatcher; Owner: -
--



--
-- Data for Name: schedule_state; Type: TABLE DATA; Schema: dispatcher; Owner: -
--



--
-- Name: attempts_id_seq; Type: SEQUENCE SET; Schema: dispatcher; Owner: -
--

SELECT pg_catalog.setval('dispatcher.attempts_id_seq', 1, false);


--
-- Name: jobs_id_seq; Type: SEQUENCE SET; Schema: dispatcher; Owner: -
--

SELECT pg_catalog.setval('dispatcher.jobs_id_seq', 1, false);


--
-- Name: outbox_id_seq; Type: SEQUENCE SET; Schema: dispatcher; Owner: -
--

SELECT pg_catalog.setval('dispatcher.outbox_id_seq', 1, false);


--
-- Name: attempts attempts_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.attempts
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (job_id, id);


--
-- Name: handlers handlers_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.handlers
    ADD CONSTRAINT handlers_pkey PRIMARY KEY (name);


--
-- Name: intake_settings intake_settings_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.intake_settings
    ADD CONSTRAINT intake_settings_pkey PRIMARY KEY (singleton);


--
-- Name: jobs jobs_due_at_in_range; Type: CHECK CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE dispatcher.jobs
    ADD CONSTRAINT jobs_due_at_in_range CHECK ((due_at <@ dispatcher.due_at_range())) NOT VALID;


--
-- Name: jobs jobs_key_key; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.jobs
    ADD CONSTRAINT jobs_key_key UNIQUE (key);


--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);


--
-- Name: jobs jobs_state_check; Type: CHECK CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE dispatcher.jobs
    ADD CONSTRAINT jobs_state_check CHECK ((state = ANY (ARRAY['scheduled'::text, 'ready'::text, 'running'::text, 'succeeded'::text, 'dead'::text, 'cancelled'::text, 'discarded'::text]))) NOT VALID;


--
-- Name: jobs jobs_traceparent_w3c; Type: CHECK CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE dispatcher.jobs
    ADD CONSTRAINT jobs_traceparent_w3c CHECK ((traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$'::text)) NOT VALID;


--
-- Name: migrations migrations_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.migrations
    ADD CONSTRAINT migrations_pkey PRIMARY KEY (version);


--
-- Name: missed_periods missed_periods_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.missed_periods
    ADD CONSTRAINT missed_periods_pkey PRIMARY KEY (schedule, period_start);


--
-- Name: outbox outbox_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);


--
-- Name: queues queues_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (name);


--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (run_key);


--
-- Name: runs runs_schedule_period_start_key; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.runs
    ADD CONSTRAINT runs_schedule_period_start_key UNIQUE (schedule, period_start);


--
-- Name: schedule_state schedule_state_pkey; Type: CONSTRAINT; Schema: dispatcher; Owner: -
--

ALTER TABLE ONLY dispatcher.schedule_state
    ADD CONSTRAINT schedule_state_pkey PRIMARY KEY (schedule);


--
-- Name: jobs_discarded; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_discarded ON dispatcher.jobs USING btree (finished_at) WHERE (state = 'discarded'::text);


--
-- Name: jobs_due_at_id; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_due_at_id ON dispatcher.jobs USING btree (due_at, id);


--
-- Name: jobs_handler_id; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_handler_id ON dispatcher.jobs USING btree (handler, id);


--
-- Name: jobs_run_key_id; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_run_key_id ON dispatcher.jobs USING btree (run_key, id) WHERE (run_key IS NOT NULL);


--
-- Name: jobs_run_unfinished; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_run_unfinished ON dispatcher.jobs USING btree (run_key) WHERE ((run_key IS NOT NULL) AND (state = ANY (ARRAY['scheduled'::text, 'ready'::text, 'running'::text])));


--
-- Name: jobs_running_lease; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_running_lease ON dispatcher.jobs USING btree (lease_expires_at) WHERE (state = 'running'::text);


--
-- Name: jobs_running_queue; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_running_queue ON dispatcher.jobs USING btree (queue) WHERE (state = 'running'::text);


--
-- Name: jobs_scheduled_due; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_scheduled_due ON dispatcher.jobs USING btree (due_at) WHERE (state = 'scheduled'::text);


--
-- Name: jobs_tenant_id; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_tenant_id ON dispatcher.jobs USING btree (tenant, id) WHERE (tenant <> ''::text);


--
-- Name: jobs_terminal; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX jobs_terminal ON dispatcher.jobs USING btree (state, queue, finished_at) WHERE (state = ANY (ARRAY['succeeded'::text, 'dead'::text, 'cancelled'::text]));


--
-- Name: outbox_claim; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX outbox_claim ON dispatcher.outbox USING btree (queue, tenant, id);


--
-- Name: runs_unfinished; Type: INDEX; Schema: dispatcher; Owner: -
--

CREATE INDEX runs_unfinished ON dispatcher.runs USING btree (schedule, period_start) WHERE (finished_at IS NULL);


--
-- Name: jobs jobs_dead_letter_notice; Type: TRIGGER; Schema: dispatcher; Owner: -
--

CREATE TRIGGER jobs_dead_letter_notice AFTER UPDATE OF state ON dispatcher.jobs FOR EACH ROW WHEN (((new.state = 'dead'::text) AND (old.state IS DISTINCT FROM 'dead'::text))) EXECUTE FUNCTION dispatcher.dead_letter_notice();


--
-- PostgreSQL database dump complete
--


