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
-- claim go on to the next priority value. Each round either fills the claim or finds a tenant
-- out of jobs; after 8 rounds on one priority (8 tenants emptied one after another by uneven
-- shares) the claim goes on to the next value with what is left, rather than loop on.
--
-- Per-key limits (migration 024): keys at their limit (keys_at_limit) are skipped at two
-- places: the walk passes over a tenant whose own name is such a key (the default key is the
-- tenant: one index probe per blocked tenant, however many jobs it holds; its jobs under other
-- keys wait for its next turn), and the pick within a tenant takes no job of such a key.
--
-- Plans: the daemon's sessions plan every statement with its parameters (force_custom_plan,
-- db/pool.py), and inside a function that means each of this function's statements anew on
-- every claim: planning was half of a claim's time in the peer benchmark's W3 (2,061 claims:
-- 2.5 of 6.5 ms per claim, pg_stat_statements). Here the plans are kept per connection
-- (plan_cache_mode = auto), and every read of job_state is a walk of jobs_ready_claim whatever
-- the statistics say (no sequential or bitmap scan: a plan kept from an empty table must not
-- read the whole table once a burst has filled it). The walk's conditions are written so a
-- kept plan can use them as index bounds: (tenant, due_at, id) > (start_tenant, start_due,
-- start_id) rather than an OR on the cursor, and ORDER BY ... LIMIT 1 rather than min().
CREATE OR REPLACE FUNCTION dispatcher.claim_pick(q text, wanted integer, caps text[],
                                      after_priority integer, after_tenant text)
RETURNS TABLE (id bigint, pos integer, priority smallint, tenant text, turn integer)
LANGUAGE plpgsql VOLATILE
-- planned once per connection and kept, on the claim index whatever the statistics (see above)
SET plan_cache_mode = auto SET enable_seqscan = off SET enable_bitmapscan = off
AS $$
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
    blocked   text[];      -- keys at their limit (per-key limits, migration 024): skipped
    from_priority integer; -- the walk takes the tenants after (from_priority, from_tenant)
    from_tenant   text;
    -- the same start as a bound on the claim index's last three columns, which a kept plan
    -- descends to (claim_firsts says why)
    start_tenant  text;
    start_due     timestamptz;
    start_id      bigint;
BEGIN
    IF wanted < 1 OR EXISTS (SELECT 1 FROM dispatcher.queues x WHERE x.name = q AND x.paused) THEN
        RETURN;  -- a paused queue offers nothing
    END IF;
    blocked := dispatcher.keys_at_limit(q);
    LOOP
        SELECT s.priority INTO lvl FROM dispatcher.job_state s  -- NULL when none
         WHERE s.queue = q AND s.state = 'ready' AND s.priority > coalesce(lvl, -32768)
         ORDER BY s.queue, s.priority LIMIT 1;
        EXIT WHEN lvl IS NULL;
        -- from the cursor at its own priority, else from before the first tenant
        IF lvl = after_priority THEN
            from_priority := lvl; from_tenant := after_tenant;
            -- past every job of the cursor's tenant
            start_tenant := after_tenant; start_due := 'infinity'; start_id := 9223372036854775807;
        ELSE
            from_priority := lvl - 1; from_tenant := '';
            -- before every job ('' is the first text in any collation)
            start_tenant := ''; start_due := '-infinity'; start_id := -9223372036854775808;
        END IF;
        -- Many small tenants: a tenant's first job each from one read of the claim index
        -- (dispatcher.claim_firsts), where the walk below costs two index probes per tenant.
        -- A claim of 1,000 among 10,000 tenants of two jobs: 14 ms by the walk, 4 by the read.
        -- The rest of the claim, if any (the read ran out of rows, or found fewer tenants than
        -- it wanted), goes to the walk, which passes over the jobs taken here.
        IF need >= 16 THEN
            SELECT f.ids, f.tenants, f.turns INTO got_ids, got_names, got_turns
              FROM dispatcher.claim_firsts(q, lvl, need, caps, blocked, from_priority,
                                           from_tenant, after_priority, after_tenant) f;
            IF got_ids IS NOT NULL THEN
                RETURN QUERY
                SELECT g.id, (wanted - need + g.n)::integer, lvl, g.tenant, g.turn
                  FROM unnest(got_ids, got_names, got_turns) WITH ORDINALITY
                       AS g(id, tenant, turn, n);
                need := need - cardinality(got_ids);
                taken := taken || got_ids;
                IF need <= 0 THEN
                    RETURN;
                END IF;
            END IF;
        END IF;
        -- the walk: the tenants after the cursor, then from the first name round to it
        WITH RECURSIVE onward AS (
            (SELECT s.tenant FROM dispatcher.job_state s
              WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                AND (s.tenant, s.due_at, s.id) > (start_tenant, start_due, start_id)
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
                  FROM (SELECT o.tenant FROM onward o WHERE o.tenant <> ALL (blocked)
                        UNION ALL SELECT r.tenant FROM round_ r WHERE r.tenant <> ALL (blocked)
                        LIMIT need) t) w;
        rounds := 0;
        LOOP
            share := ceil(need::float8 / cardinality(walked))::integer;
            WITH picked AS (
                SELECT c.id, w.tenant, w.turn, c.rank
                  -- every tenant walked; the LIMIT only tells a kept plan to expect few
                  -- (a plan for ten tenants looked dearer than planning anew each claim)
                  FROM (SELECT * FROM unnest(walked, turns) AS u(tenant, turn)
                         LIMIT cardinality(walked)) AS w(tenant, turn)
                 CROSS JOIN LATERAL (
                       SELECT l.id, row_number() OVER (ORDER BY l.due_at, l.id) AS rank
                         FROM (SELECT s.id, s.due_at FROM dispatcher.job_state s
                                WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                                  AND s.tenant = w.tenant AND s.capability = ANY (caps)
                                  AND s.due_at <= now()  -- none before its due time
                                  AND (s.concurrency_key IS NULL
                                       OR s.concurrency_key <> ALL (blocked))
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
