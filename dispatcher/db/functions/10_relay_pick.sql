-- The relay's pick (lease_outbox): the outbox rows of queue `q` to publish next, in the order
-- claim_pick takes ready jobs (priority, then tenants in turn from the caller's cursor, then the
-- oldest row first: created_at, then id), among the rows no relay holds (leased_until NULL,
-- the rows of the index outbox_to_relay, migration 041: a lease that ran out unconfirmed is
-- released by release_outbox). The relay publishes them in this order and a broker queue delivers in
-- publishing order, so the priority survives the broker: what the broker holds ahead of an
-- urgent job is at most the queue's relay window.
CREATE OR REPLACE FUNCTION dispatcher.relay_pick(q text, wanted integer, after_priority integer,
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
    -- the walk's start as a bound on the index's last three columns: past every row of the
    -- cursor's tenant at its own priority, else before every row ('' is the first text).
    -- Each read here is one a plan descends to, a kept one too (a pooled session has no
    -- plan_cache_mode of ours): planned generically, an OR on the cursor read every row before
    -- it, and min() every row of the queue (tests/db/test_relay_order.py)
    start_tenant  text;
    start_created timestamptz;
    start_id      bigint;
BEGIN
    IF wanted < 1 THEN
        RETURN;
    END IF;
    LOOP
        SELECT s.priority INTO lvl FROM dispatcher.outbox s  -- NULL when none
         WHERE s.queue = q AND s.leased_until IS NULL AND s.priority > coalesce(lvl, -32768)
         ORDER BY s.queue, s.priority LIMIT 1;
        EXIT WHEN lvl IS NULL;
        IF lvl = after_priority THEN
            start_tenant := after_tenant; start_created := 'infinity';
            start_id := 9223372036854775807;
        ELSE
            start_tenant := ''; start_created := '-infinity'; start_id := -9223372036854775808;
        END IF;
        -- the walk: the tenants after the cursor, then from the first name round to it
        WITH RECURSIVE onward AS (
            (SELECT s.tenant FROM dispatcher.outbox s
              WHERE s.queue = q
                AND s.leased_until IS NULL AND s.priority = lvl
                AND (s.tenant, s.created_at, s.id) > (start_tenant, start_created, start_id)
              ORDER BY s.tenant LIMIT 1)
            UNION ALL
            SELECT n.tenant FROM onward o
             CROSS JOIN LATERAL (
                   SELECT s.tenant FROM dispatcher.outbox s
                    WHERE s.queue = q
                AND s.leased_until IS NULL AND s.priority = lvl
                      AND s.tenant > o.tenant
                    ORDER BY s.tenant LIMIT 1) n
        ), round_ AS (
            (SELECT s.tenant FROM dispatcher.outbox s
              WHERE lvl = after_priority AND s.queue = q AND s.leased_until IS NULL
                AND s.priority = lvl AND s.tenant <= after_tenant
              ORDER BY s.tenant LIMIT 1)
            UNION ALL
            SELECT n.tenant FROM round_ o
             CROSS JOIN LATERAL (
                   SELECT s.tenant FROM dispatcher.outbox s
                    WHERE s.queue = q
                AND s.leased_until IS NULL AND s.priority = lvl
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
                                  AND s.leased_until IS NULL AND s.priority = lvl
                                  AND s.tenant = w.tenant AND s.id <> ALL (taken)
                                -- the oldest first, in outbox_to_relay's order: ordered by id
                                -- alone, the primary key gave the order too, and the planner
                                -- walked it past every leased row
                                ORDER BY s.created_at, s.id
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
