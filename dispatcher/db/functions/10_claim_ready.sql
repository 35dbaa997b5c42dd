-- Claim up to `wanted` ready jobs of queue `q` that this worker can run (`caps`: handler:version
-- list) and lease them to `owner` for `lease_s` seconds: the lowest priority value first; within
-- one priority, tenants take turns from where this claimer's previous claim stopped
-- (`after_priority`, `after_tenant`: the marker row's cursor; NULL at first), so every tenant is
-- reached whatever their number; within a tenant, the earliest due first (dispatcher.claim_pick,
-- migration 023). One statement takes a ready job straight to running (no outbox row to read or
-- delete, migration 015). The queue's global limits (migration 013) grant how many may start;
-- the last row, always present, gives back what the claim did not use and carries the seconds
-- until a token is free (NULL: none missing).
-- The daemon's memory budget (migration 020): of the jobs picked, the claim takes the longest
-- prefix whose payload and target bytes fit in `byte_budget`; with `alone` (the daemon holds
-- nothing else) the first job is taken whatever its size.
--
-- A function, for its plan: the daemon's sessions plan every statement with its parameters
-- (force_custom_plan, db/pool.py), and planning this statement took about a third of a claim
-- of one job (0.9 of 2.8 ms per claim in the peer benchmark's W3, pg_stat_statements with
-- track_planning). Its plan does not depend on the parameters' values: every read of a job's
-- rows is by id (the functions it calls walk the claim index themselves). Kept per connection
-- (force_generic_plan: with `auto`, the plain case's branches below made each custom plan, which
-- drops the branch not taken, look cheaper than the kept one, and every claim was planned anew,
-- 1.2 ms), with no sequential scan, so a plan kept from an empty table still probes the primary
-- keys once a burst has filled them (10_claim_pick.sql says why).
-- Returns the claimed jobs, then one marker row (its first 17 columns NULL; `drained`,
-- migration 047: nothing else is ready for this worker, so the loop need not look again).
--
-- The plain case, in fewer statements: a queue with no key limits and no limit group whose
-- lowest priority with ready jobs holds one tenant's (every job of a steady stream, a drain or
-- a burst of one producer, and priorities used without tenants) is claimed without the turns,
-- the key functions and their reads of the queue row. Two probes of the claim index (the first
-- ready job, and the next priority or tenant after its) tell it; the grant is then taken and
-- that tenant's jobs at that priority walked, earliest due first, and started in one statement
-- of its own: the order the turns give one tenant at one priority. A claim that empties
-- the priority stops there (the next claim goes on with the next one: the strict order holds,
-- and the claim loop claims again at once, as it is not `drained`). A queue with nothing ready
-- answers the marker alone, without taking permits it would give back. The plain case's grant
-- is a slot of parked permits its first statement locks (claim_grant's first step), and the
-- statement that starts the jobs draws on it only those started: no grant function, nothing to
-- give back (0.29-0.37 -> 0.25-0.26 ms per claim of one job); with no such slot, claim_grant.
-- Before, a claim of one job ran about 17 statements (claim_grant, claim_pick, keys_at_limit,
-- key_take, claim_settle): 1.44-1.69 ms of server time per claim of one job, 0.83-1.24 now (a
-- private PostgreSQL 15, 2 cores, 1,000 claims per run, pg_stat_statements).
--
-- The plain case's one job (a steady stream: each claim finds the one job just enqueued) is
-- claimed without the walk's statement: the probe reads the ready job after the first as well,
-- and when it is another tenant's or priority's (or there is none) the first is the only one
-- the walk could take. It is locked and read with its intent by id, started by an update with
-- no branches, and the rows are returned from variables. The plans' start is most of a claim of
-- one job (44 % of its instructions, callgrind): this case's statements start at most four plan
-- nodes each where the walk's statement starts 25 (tests/db/test_claim_plan.py). 1.32 M -> 1.06 M
-- PostgreSQL instructions a claim of one job (claim_one_limited,
-- tests/bench/bench_instructions.py).
CREATE OR REPLACE FUNCTION dispatcher.claim_ready(
    q text, wanted integer, caps text[], owner text, lease_s float8, byte_budget bigint,
    alone boolean, after_priority integer, after_tenant text)
RETURNS TABLE (
    id bigint, key text, queue text, tenant text, handler text, handler_version integer,
    target jsonb, payload jsonb, attempt integer, max_attempts integer, due_at timestamptz,
    progress jsonb, run_key text, due_to_start_s float8, traceparent text, size_bytes bigint,
    timeout_s float8, taken_count integer, wait_s float8, held_back boolean,
    cursor_priority smallint, cursor_tenant text, key_throttled boolean, expired_count integer,
    drained boolean)
LANGUAGE plpgsql VOLATILE
-- planned once per connection and kept (generic), by index whatever the statistics (above)
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    plain        boolean;   -- no key limits, no group, not paused
    one_priority smallint;  -- the priority and tenant of the first ready job (NULL: none)
    one_tenant   text;
    single       boolean;   -- no other tenant has ready jobs at that priority
    beyond       boolean;   -- ready jobs of another priority or tenant wait after them
    fast         boolean;   -- the plain case: plain and single
    granted_n    integer;   -- the grant, taken before the pick
    grant_wait_s float8;
    slot_n       integer;   -- the plain case: a slot of parked permits this claim locked
    slot_taken   integer;   -- and draws on (only what it starts), without claim_grant
    -- the jobs picked, in the order the claim takes them, with their priority, tenant and turn
    -- (the cursor: the last tenant served at the last priority reached)
    cand_ids        bigint[];
    cand_priorities smallint[];
    cand_tenants    text[];
    cand_turns      integer[];
    -- the plain case's one job: the first ready job, when the one after it (`next_*`, in the
    -- claim index's order) is another tenant's or priority's or there is none
    one_id        bigint;
    one_job       boolean;
    next_priority smallint;
    next_tenant   text;
    one_expired   boolean;      -- its time to live passed: ended, not started
    one_due       timestamptz;
    picked_one    boolean := false;  -- locked (ready, runnable here, due)
    taken_one     integer := 0;      -- within the memory budget: started or ended expired
    started_one   integer := 0;
BEGIN
    SELECT f.plain, a.priority, a.tenant, a.id, c.priority, c.tenant, pm.slot, pm.n
      INTO plain, one_priority, one_tenant, one_id, next_priority, next_tenant, slot_taken,
           slot_n
      FROM dispatcher.queues x
     CROSS JOIN LATERAL (SELECT NOT x.paused AND x.limit_group IS NULL
                                AND x.key_max_inflight IS NULL AND x.key_rate_per_s IS NULL
                                AND NOT EXISTS (SELECT 1 FROM dispatcher.key_limits o
                                                 WHERE o.queue = q) AS plain) f
      LEFT JOIN LATERAL (SELECT s.priority, s.tenant, s.due_at, s.id
                           FROM dispatcher.job_state s
                          WHERE s.queue = q AND s.state = 'ready'
                          ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id LIMIT 1) a ON true
      -- the ready job after it: another tenant's or priority's, or none, makes the first the
      -- plain case's one job (one descent of the claim index past the first)
      LEFT JOIN LATERAL (SELECT s.priority, s.tenant FROM dispatcher.job_state s
                          WHERE s.queue = q AND s.state = 'ready'
                            AND (s.priority, s.tenant, s.due_at, s.id)
                                > (a.priority, a.tenant, a.due_at, a.id)
                          ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id LIMIT 1) c ON true
      -- the plain case's grant (plain, something ready, and no other tenant's job next at that
      -- priority): the fullest slot of parked permits no other claim holds, as claim_grant
      -- would take first; locked to commit, drawn on for the jobs started only
      LEFT JOIN LATERAL (SELECT p.slot, p.n FROM dispatcher.claim_permits p
                          WHERE p.queue = q AND p.n > 0 AND f.plain AND a.priority IS NOT NULL
                            AND NOT coalesce(c.priority = a.priority AND c.tenant <> a.tenant,
                                         false)
                          ORDER BY p.n DESC, p.slot LIMIT 1
                            FOR UPDATE SKIP LOCKED) pm ON true
     WHERE x.name = q;  -- no row (a queue the daemon has not set up): the full claim
    one_job := one_priority IS NULL OR next_priority IS DISTINCT FROM one_priority
               OR next_tenant IS DISTINCT FROM one_tenant;
    IF NOT one_job THEN  -- the first tenant has more jobs at that priority: the next tenant's
        SELECT s.priority INTO next_priority FROM dispatcher.job_state s
         WHERE s.queue = q AND s.state = 'ready'
           AND (s.priority, s.tenant) > (one_priority, one_tenant)
         ORDER BY s.queue, s.priority, s.tenant LIMIT 1;  -- none: NULL
    END IF;
    single := next_priority IS DISTINCT FROM one_priority;
    beyond := next_priority IS NOT NULL;
    IF NOT single THEN
        slot_taken := NULL;  -- the turns take their grant from claim_grant (the same slot)
    END IF;
    fast := coalesce(plain AND single, false);
    IF plain AND one_priority IS NULL THEN  -- nothing ready: the marker alone
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::text,
               NULL::integer, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
               NULL::timestamptz, NULL::jsonb, NULL::text, NULL::float8, NULL::text, NULL::bigint,
               NULL::float8, 0, NULL::float8, false, NULL::smallint, NULL::text, false, 0, true;
        RETURN;
    END IF;
    IF slot_taken IS NOT NULL THEN  -- locked only in the plain case (fast)
        -- as claim_grant's first step, in this claim's own statements: a claim of one job on a
        -- steady stream (W3) spent a quarter of its server time in the grant's function
        granted_n := least(greatest(wanted, 0), slot_n);
    ELSE
        SELECT g.granted, g.wait_s INTO granted_n, grant_wait_s
          FROM dispatcher.claim_grant(q, wanted) g;
    END IF;
    IF fast AND one_job THEN
        -- The plain case's one job: what the walk's statement below would do for it, in
        -- statements of a few plan nodes each.
        IF granted_n > 0 THEN
            -- as the walk: still ready, runnable here, due; another claim's lock skips it
            SELECT i.key, i.tenant, i.handler, i.handler_version, i.target, i.payload,
                   i.max_attempts, i.traceparent, i.timeout_s,
                   coalesce(i.size_bytes, dispatcher.stored_bytes(i.payload, i.target)),
                   l.expires_at <= now()
              INTO key, tenant, handler, handler_version, target, payload, max_attempts,
                   traceparent, timeout_s, size_bytes, one_expired
              FROM dispatcher.job_state l
              JOIN dispatcher.intents i ON i.id = l.id
             WHERE l.id = one_id AND l.state = 'ready' AND l.capability = ANY (caps)
               AND l.due_at <= now()
               FOR UPDATE OF l SKIP LOCKED;
            picked_one := FOUND;
        END IF;
        IF picked_one AND (size_bytes <= byte_budget OR alone) THEN
            taken_one := 1;
            IF one_expired THEN  -- ended instead of started, as the walk's update would
                UPDATE dispatcher.job_state s
                   SET state = 'dead', lease_owner = NULL, lease_expires_at = NULL,
                       dead_reason = 'expired', finished_at = now(),
                       last_error = 'expired at ' || s.expires_at || ' before an attempt started'
                 WHERE s.id = one_id;
            ELSE
                started_one := 1;
                UPDATE dispatcher.job_state s
                   SET state = 'running', attempt = s.attempt + 1, lease_owner = owner,
                       lease_expires_at = now() + make_interval(secs => lease_s),
                       started_at = now()
                 WHERE s.id = one_id
                RETURNING s.attempt, s.due_at, s.progress, s.run_key
                     INTO attempt, one_due, progress, run_key;
                IF slot_taken IS NOT NULL THEN
                    UPDATE dispatcher.claim_permits p SET n = p.n - 1
                     WHERE p.queue = q AND p.slot = slot_taken;
                END IF;
                id := one_id;
                queue := q;
                -- a due time out of range: as the statements below report it
                due_at := least(greatest(one_due, lower(dispatcher.due_at_range())),
                                upper(dispatcher.due_at_range()));
                due_to_start_s := CASE WHEN one_due <@ dispatcher.due_at_range()
                                       THEN extract(epoch FROM now() - one_due) ELSE 0 END;
                RETURN NEXT;
            END IF;
        END IF;
        -- the marker row, as the walk's statement writes it
        id := NULL; key := NULL; queue := NULL; tenant := NULL; handler := NULL;
        handler_version := NULL; target := NULL; payload := NULL; attempt := NULL;
        max_attempts := NULL; due_at := NULL; progress := NULL; run_key := NULL;
        due_to_start_s := NULL; traceparent := NULL; size_bytes := NULL; timeout_s := NULL;
        taken_count := taken_one;
        wait_s := CASE WHEN slot_taken IS NULL
                       THEN dispatcher.claim_settle(q, granted_n, started_one, grant_wait_s) END;
        held_back := picked_one AND taken_one = 0;
        cursor_priority := CASE WHEN taken_one > 0 THEN one_priority END;
        cursor_tenant := CASE WHEN taken_one > 0 THEN one_tenant END;
        key_throttled := false;
        expired_count := taken_one - started_one;
        drained := NOT beyond AND picked_one::int < granted_n AND NOT held_back;
        RETURN NEXT;
        RETURN;
    END IF;
    IF fast THEN
        -- The plain case in one statement of its own: the walk of the tenant's jobs at that
        -- priority, earliest due first (the order the turns give one tenant), the memory
        -- budget, the start and the slot's draw. Its plan is only what this case uses: no key
        -- functions, no cursor arrays, one aggregate for the counts, the jobs' columns carried
        -- by the update itself (no join back). A claim of one job (W3): 1.58 M -> 1.34 M
        -- PostgreSQL instructions (tests/bench/bench_instructions.py, claim_one_limited).
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT s.id, s.due_at FROM dispatcher.job_state s
             WHERE s.queue = q AND s.state = 'ready' AND s.priority = one_priority
               AND s.tenant = one_tenant AND s.capability = ANY (caps)
               -- moved ahead of its due time by the due-scan: not before it (queries.sql
               -- scan_due); a bound on the walk, which stops at the tenant's first such job
               AND s.due_at <= now()
               -- always true: a bound only the claim index can use, so the kept plan walks
               -- it; without, a plan kept from statistics of a drain's start walked the due
               -- index over every job claimed before (jobs_due_at_id, which held the ready
               -- jobs until migration 050; tests/db/test_claim_plan.py)
               AND (s.queue, s.priority, s.tenant, s.due_at)
                   >= (q, one_priority, one_tenant, '-infinity'::timestamptz)
             ORDER BY s.due_at, s.id
             LIMIT granted_n
               FOR UPDATE SKIP LOCKED
        ), budgeted AS MATERIALIZED (
            -- as below: the intents' one probe per job, for its size and what it carries
            SELECT b.* FROM (
                SELECT z.*, sum(z.size_bytes) OVER w AS upto, row_number() OVER w AS pos
                  FROM picked p
                 CROSS JOIN LATERAL (
                       SELECT i.id, i.key, i.tenant, i.handler, i.handler_version, i.target,
                              i.payload, i.max_attempts, i.traceparent, i.timeout_s,
                              coalesce(i.size_bytes, dispatcher.stored_bytes(i.payload, i.target))
                              AS size_bytes
                         FROM dispatcher.intents i WHERE i.id = p.id OFFSET 0) z
                WINDOW w AS (ORDER BY p.due_at, p.id)) b
             WHERE b.upto <= byte_budget OR (b.pos = 1 AND alone)
        ), claimed AS (
            -- the start (or the end of an expired job), assignment for assignment as in the
            -- turns' statement below: two statements of one function cannot share them
            UPDATE dispatcher.job_state s
               SET state = CASE WHEN s.expires_at <= now() THEN 'dead' ELSE 'running' END,
                   attempt = CASE WHEN s.expires_at <= now() THEN s.attempt ELSE s.attempt + 1 END,
                   lease_owner = CASE WHEN s.expires_at <= now() THEN NULL ELSE owner END,
                   lease_expires_at = CASE WHEN s.expires_at <= now() THEN NULL
                                           ELSE now() + make_interval(secs => lease_s) END,
                   started_at = CASE WHEN s.expires_at <= now() THEN s.started_at ELSE now() END,
                   dead_reason = CASE WHEN s.expires_at <= now() THEN 'expired'
                                      ELSE s.dead_reason END,
                   finished_at = CASE WHEN s.expires_at <= now() THEN now() ELSE s.finished_at END,
                   last_error = CASE WHEN s.expires_at <= now()
                                     THEN 'expired at ' || s.expires_at
                                          || ' before an attempt started'
                                     ELSE s.last_error END
              FROM budgeted b
             -- locked by the walk: still ready. One probe of the primary key per job: with
             -- `s.id = b.id`, a plan kept from a table of tens of thousands of rows joined by
             -- merge, reading the key from its first row to the last job claimed (a W2 drain's
             -- claim of 1,000 grew from 21 to 51 ms over 40,000 jobs). An array's membership is
             -- no join condition a merge or a hash can use: the nested loop is the only plan.
             WHERE s.id = ANY (ARRAY[b.id])
            -- the intent's columns from the row joined: a join of the two CTEs afterwards was
            -- a nested loop in the kept plan (its estimates: one row each), 1,000 x 1,000
            -- comparisons for a claim of 1,000
            RETURNING s.id, b.key, s.queue, b.tenant, b.handler, b.handler_version, b.target,
                      b.payload, s.attempt, b.max_attempts, s.due_at, s.progress, s.run_key,
                      b.traceparent, b.size_bytes, b.timeout_s, s.state
        ), tally AS MATERIALIZED (  -- the marker's and the draw's counts, in one aggregate
            SELECT count(*) FILTER (WHERE c.state = 'running')::int AS started_n,
                   count(*)::int AS taken_n,
                   (SELECT count(*) FROM picked)::int AS picked_n
              FROM claimed c
        ), drawn AS (
            UPDATE dispatcher.claim_permits p SET n = p.n - t.started_n
              FROM tally t
             WHERE p.queue = q AND p.slot = slot_taken
        )
        SELECT c.id, c.key, c.queue, c.tenant, c.handler, c.handler_version, c.target,
               c.payload, c.attempt, c.max_attempts,
               -- a due time out of range reported at the range's end (the statement below
               -- says why: one job's row must not fail its whole queue's claim)
               least(greatest(c.due_at, lower(dispatcher.due_at_range())),
                     upper(dispatcher.due_at_range())),
               c.progress, c.run_key,
               CASE WHEN c.due_at <@ dispatcher.due_at_range()
                    THEN extract(epoch FROM now() - c.due_at) ELSE 0 END::float8,
               c.traceparent, c.size_bytes, c.timeout_s,
               NULL::int, NULL::float8, NULL::boolean, NULL::smallint, NULL::text,
               NULL::boolean, NULL::int, NULL::boolean
          FROM claimed c
         WHERE c.state = 'running'
        UNION ALL
        -- the marker row, as the statement below writes it: no key waits in the plain case,
        -- the cursor the one tenant's once a job was taken, drained when the walk found fewer
        -- than the grant, the budget held none back and nothing waits at another priority
        SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL, NULL, t.taken_n,
               CASE WHEN slot_taken IS NULL
                    THEN dispatcher.claim_settle(q, granted_n, t.started_n, grant_wait_s) END,
               t.picked_n > t.taken_n,
               CASE WHEN t.taken_n > 0 THEN one_priority END,
               CASE WHEN t.taken_n > 0 THEN one_tenant END,
               false,
               t.taken_n - t.started_n,
               NOT beyond AND t.picked_n < granted_n AND t.picked_n = t.taken_n
          FROM tally t;
        RETURN;
    END IF;
    -- the turns (a paused queue offers nothing: claim_pick looks first)
    SELECT coalesce(array_agg(p.id ORDER BY p.pos), '{}'),
           array_agg(p.priority ORDER BY p.pos), array_agg(p.tenant ORDER BY p.pos),
           array_agg(p.turn ORDER BY p.pos)
      INTO cand_ids, cand_priorities, cand_tenants, cand_turns
      FROM dispatcher.claim_pick(q, granted_n, caps, after_priority, after_tenant) p;
    -- One statement starts the jobs the turns picked: the grant and the pick are taken before
    -- it (the plain case, above, has its own).
    RETURN QUERY
    WITH budgeted AS MATERIALIZED (
        -- The one primary-key probe of the intents per candidate, for its size (migration 020)
        -- and for what the claimed job carries (a payload stays a TOAST pointer until it is
        -- sent). Probed here for the size and again for the jobs claimed, the intents made a claim
        -- of 1,000 no-op jobs among 20,000 26 % slower than before migration 020 (median 44 ->
        -- 56 ms, 2 loaded cores); read once, 6 % (47 ms).
        SELECT b.* FROM (
            SELECT c.pos, z.*, sum(z.size_bytes) OVER (ORDER BY c.pos) AS upto
              FROM unnest(cand_ids) WITH ORDINALITY AS c(id, pos)
             CROSS JOIN LATERAL (
                   SELECT i.id, i.key, i.tenant, i.handler, i.handler_version, i.target, i.payload,
                          i.max_attempts, i.traceparent, i.timeout_s,
                          coalesce(i.size_bytes, dispatcher.stored_bytes(i.payload, i.target))
                          AS size_bytes, i.concurrency_key
                     FROM dispatcher.intents i WHERE i.id = c.id OFFSET 0) z) b
         WHERE b.upto <= byte_budget OR (b.pos = 1 AND alone)
    ), keyed AS MATERIALIZED (
        -- what each job's concurrency key may start now (migration 024); the rest stay ready.
        -- `claimed` starts (or ends expired) every job kept: key_take counts their starts itself
        SELECT dispatcher.key_take(q, ARRAY(SELECT id FROM budgeted ORDER BY pos),
                                   ARRAY(SELECT concurrency_key FROM budgeted ORDER BY pos),
                                   true) AS ids
    ), keys_full AS MATERIALIZED (
        -- keys at their limit as the claim began (the pick skipped their jobs): the claim loop
        -- looks again soon, and the claim counts as throttled (dispatcher_key_throttled_claims)
        SELECT dispatcher.key_wait_s() AS wait_s
    ), claimed AS (
        -- A job whose time to live passed after the scan moved it is ended here instead of
        -- started (`dead`, `expired`; migration 030): the same update, so no row is read twice.
        UPDATE dispatcher.job_state s
           SET state = CASE WHEN s.expires_at <= now() THEN 'dead' ELSE 'running' END,
               attempt = CASE WHEN s.expires_at <= now() THEN s.attempt ELSE s.attempt + 1 END,
               lease_owner = CASE WHEN s.expires_at <= now() THEN NULL ELSE owner END,
               lease_expires_at = CASE WHEN s.expires_at <= now() THEN NULL
                                       ELSE now() + make_interval(secs => lease_s) END,
               started_at = CASE WHEN s.expires_at <= now() THEN s.started_at ELSE now() END,
               dead_reason = CASE WHEN s.expires_at <= now() THEN 'expired' ELSE s.dead_reason END,
               finished_at = CASE WHEN s.expires_at <= now() THEN now() ELSE s.finished_at END,
               last_error = CASE WHEN s.expires_at <= now()
                                 THEN 'expired at ' || s.expires_at || ' before an attempt started'
                                 ELSE s.last_error END
         WHERE s.id = ANY ((SELECT ids FROM keyed)::bigint[])  -- locked above: still ready
        RETURNING s.id, s.queue, s.attempt, s.due_at, s.progress, s.run_key, s.state
    ), started AS (
        SELECT c.id, i.key, c.queue, i.tenant, i.handler, i.handler_version, i.target, i.payload,
               c.attempt, i.max_attempts,
               -- A due time out of range (stored before migration 006, or with its check
               -- dropped) must not fail the claim of its whole queue: `now() - '-infinity'`
               -- raises, and a year Python cannot hold fails the read. Report the nearest end
               -- of the range, and no lateness.
               least(greatest(c.due_at, lower(dispatcher.due_at_range())),
                     upper(dispatcher.due_at_range())) AS due_at,
               c.progress, c.run_key,
               CASE WHEN c.due_at <@ dispatcher.due_at_range()
                    THEN extract(epoch FROM now() - c.due_at) ELSE 0 END::float8 AS due_to_start_s,
               i.traceparent,
               i.size_bytes,
               i.timeout_s  -- the 17th column, last of those `Job` is built from by position
          FROM claimed c
          JOIN budgeted i ON i.id = c.id
         WHERE c.state = 'running'
    )
    SELECT c.*, (SELECT cardinality(ids) FROM keyed)::int AS taken_count, NULL::float8 AS wait_s,
           NULL::boolean AS held_back, NULL::smallint AS cursor_priority, NULL::text AS cursor_tenant,
           NULL::boolean AS key_throttled, NULL::int AS expired_count, NULL::boolean AS drained
      FROM started c
    UNION ALL
    -- the marker row: how many ready jobs the claim took (those picked beyond the memory budget
    -- are left ready, unlocked at commit), the limiter's wait, and whether the memory budget held
    -- picked jobs back (then, and only then, the claim loop waits for bytes to be freed); keys at
    -- their limit (migration 024) make the loop look again soon, as their slots free; and how many
    -- it ended expired
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, (SELECT cardinality(ids) FROM keyed)::int,
           coalesce(dispatcher.claim_settle(q, granted_n, (SELECT count(*) FROM started)::int,
                                            grant_wait_s),
                    (SELECT wait_s FROM keys_full)),
           cardinality(cand_ids) > (SELECT count(*) FROM budgeted),
           -- the cursor: the last tenant served at the last priority reached
           c.priority, c.tenant,
           (SELECT wait_s IS NOT NULL FROM keys_full)
           OR (SELECT cardinality(ids) FROM keyed) < (SELECT count(*) FROM budgeted),
           (SELECT count(*) FROM claimed WHERE state = 'dead')::int,  -- ended expired (030)
           false  -- drained (migration 047): said by the plain case only
      -- the jobs kept are a prefix of the candidates (a running sum of sizes under the
      -- budget): compared by position, not each id against an array of all of them (that
      -- was 1,000 x 1,000 comparisons, 3.4 of 39 ms of a claim of 1,000)
      FROM (SELECT 1) one
      LEFT JOIN (SELECT x.priority, x.tenant
                   FROM unnest(cand_priorities, cand_tenants, cand_turns) WITH ORDINALITY
                        AS x(priority, tenant, turn, pos)
                  WHERE x.pos <= (SELECT max(b.pos) FROM budgeted b)
                  ORDER BY x.priority DESC, x.turn DESC LIMIT 1) c ON true;
END
$$;
