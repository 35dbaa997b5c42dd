-- Queue limits that change without a stall, and limit groups shared by queues (issue 22).
--
-- Part 1: limiter state that outlives a limits change ("lowering a queue's limits stalls it").
--
-- Measured before (tests/db/test_limits_change.py): a queue at 1000/s, burst 1000, 2,000 in
-- flight, one claim of 100 parks 8 x 100 permits (migration 016); lowering the limits to 2/s,
-- burst 5, 4 in flight dropped those permits (the trigger) but left `permits_parked` at 800.
-- The next refill was capped at burst - permits_parked = 5 - 800, the bucket went 795 tokens
-- into debt and the queue started nothing for 398 s. On daemons (2 drain 3,000 jobs, one is
-- killed, 3 start with the lower limits) it started 23-68 jobs in 10 s instead of ~128.
--
-- What a queue's limiter keeps between claims, and what a change of its limits now does to it:
--   claim_permits.n     parked under the old limits: dropped, and given back to the bucket
--                       (they were part of its level), which is then capped at the new burst
--   permits_parked      the cap on the next refill: zero, since nothing is parked any more
--   tokens              at most the new burst (a raised one refills at the new rate)
--   tokens_at           kept: the refill since then is credited at the new rate, capped by the
--                       new burst, so the bucket's level never passes the new burst
--   running jobs        counted afresh by every claim (job_state), nothing cached
-- The change takes the queue row first, then the slots (waiting for the claims that hold one,
-- which never wait for the queue row while they do), so no claim sees half of it. The same
-- trigger serves every door that changes limits: the daemon's start with another file
-- (upsert_queue), a run-time change, a plain UPDATE.
--
-- And what no door may write: a rate without a burst (the refill had no cap at all).
ALTER TABLE dispatcher.queues
    ADD CONSTRAINT queues_rate_needs_a_burst CHECK (rate_per_s IS NULL OR burst IS NOT NULL);

DROP TRIGGER queues_limits_changed ON dispatcher.queues;
DROP FUNCTION dispatcher.drop_claim_permits();

CREATE FUNCTION dispatcher.limits_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    dropped bigint;
BEGIN
    SELECT coalesce(sum(p.n), 0) INTO dropped FROM (
        SELECT n FROM dispatcher.claim_permits
         WHERE queue = NEW.name AND n > 0
           FOR UPDATE) p;
    IF dropped > 0 THEN
        UPDATE dispatcher.claim_permits SET n = 0 WHERE queue = NEW.name AND n > 0;
    END IF;
    NEW.permits_parked := 0;
    IF NEW.rate_per_s IS NOT NULL THEN
        NEW.tokens := least(NEW.burst, greatest(NEW.tokens, 0) + dropped);
    END IF;
    RETURN NEW;
END
$$;

-- A bucket already in debt from the defect (tokens below zero) is made whole.
UPDATE dispatcher.queues SET tokens = 0, permits_parked = 0 WHERE tokens < 0;

-- Part 2: limit groups (issue 22 point 2; seed 001: "a rate limit shared with other background
-- jobs"). A group is a budget (start rate with burst, in-flight cap) that the queues naming it
-- share, across all daemons, on top of each queue's own limits: a start needs both.
--
-- A claim of a queue in a group locks the queue row, then the group row (always in that order;
-- the registry sync only inserts groups before the queues, and updates them after), refills the
-- group's bucket, counts the running jobs of all its queues, and takes from both. Such a queue
-- parks no permits (migration 016): a claim on parked permits would bypass the group, so the
-- claims of a group run one after another, each one short statement (docs/guides/limits.md
-- gives the cost). Joining a group drops the queue's parked permits (the trigger above).
--
-- When the group's headroom is short, the queues with a better (lower) group_priority get it
-- first: a claim leaves in the group what the better queues of the group with ready work could
-- start at once (their ready jobs, capped by their own limits and by the headroom), and looks
-- again shortly. A better queue that is idle, paused or at its own limits reserves nothing.
CREATE TABLE dispatcher.limit_groups (
    name         text PRIMARY KEY,
    rate_per_s   float8 CHECK (rate_per_s > 0),
    burst        integer CHECK (burst >= 1),
    max_inflight integer CHECK (max_inflight >= 1),
    tokens       float8 NOT NULL DEFAULT 0,
    tokens_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT limit_groups_rate_needs_a_burst CHECK (rate_per_s IS NULL OR burst IS NOT NULL)
);

ALTER TABLE dispatcher.queues
    ADD COLUMN limit_group text
        CONSTRAINT queues_limit_group_exists REFERENCES dispatcher.limit_groups (name)
        ON DELETE SET NULL,
    ADD COLUMN group_priority integer NOT NULL DEFAULT 0
        CONSTRAINT queues_group_priority_range CHECK (group_priority BETWEEN -100 AND 100);
CREATE INDEX queues_limit_group ON dispatcher.queues (limit_group) WHERE limit_group IS NOT NULL;

CREATE TRIGGER queues_limits_changed
    BEFORE UPDATE OF rate_per_s, burst, max_inflight, limit_group ON dispatcher.queues
    FOR EACH ROW
    WHEN ((OLD.rate_per_s, OLD.burst, OLD.max_inflight, OLD.limit_group)
          IS DISTINCT FROM (NEW.rate_per_s, NEW.burst, NEW.max_inflight, NEW.limit_group))
    EXECUTE FUNCTION dispatcher.limits_changed();

-- A group's new limits apply at once: its bucket never holds more than the new burst.
CREATE FUNCTION dispatcher.group_limits_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.rate_per_s IS NOT NULL THEN
        NEW.tokens := least(NEW.burst, greatest(NEW.tokens, 0));
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER limit_groups_limits_changed
    BEFORE UPDATE OF rate_per_s, burst, max_inflight ON dispatcher.limit_groups
    FOR EACH ROW EXECUTE FUNCTION dispatcher.group_limits_changed();

-- What queue `b` could start at once, at most `cap`: its ready jobs, within its own limits
-- (read, not locked: an estimate for the reserve, never a grant).
CREATE FUNCTION dispatcher.could_start(b dispatcher.queues, cap bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    n bigint := greatest(cap, 0);
BEGIN
    IF b.rate_per_s IS NOT NULL THEN
        n := least(n, greatest(floor(least(b.burst, b.tokens + extract(epoch FROM
                 clock_timestamp() - b.tokens_at) * b.rate_per_s)), 0)::bigint);
    END IF;
    IF b.max_inflight IS NOT NULL AND n > 0 THEN
        n := least(n, b.max_inflight - (SELECT count(*) FROM (
                 SELECT 1 FROM dispatcher.job_state s
                  WHERE s.queue = b.name AND s.state = 'running' LIMIT b.max_inflight) j));
    END IF;
    IF n > 0 THEN
        n := (SELECT count(*) FROM (SELECT 1 FROM dispatcher.job_state s
                                     WHERE s.queue = b.name AND s.state = 'ready' LIMIT n) j);
    END IF;
    RETURN greatest(n, 0);
END
$$;

-- The group's part of a grant: at most `wanted` of group `grp`'s headroom for queue `q` of
-- priority `prio`, less what better queues of the group could start now. Called by claim_grant
-- with the queue row locked; locks the group row until the claim commits.
CREATE FUNCTION dispatcher.group_grant(grp text, q text, prio integer, wanted integer,
                                       OUT granted integer, OUT wait_s float8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    g        dispatcher.limit_groups;
    at       timestamptz;
    avail    float8;
    headroom bigint := 2147483647;
    running  bigint;
    reserved bigint;
BEGIN
    granted := wanted;
    SELECT * INTO g FROM dispatcher.limit_groups WHERE name = grp FOR UPDATE;
    IF NOT FOUND OR wanted < 1 THEN
        RETURN;
    END IF;
    at := greatest(g.tokens_at, clock_timestamp());
    IF g.rate_per_s IS NOT NULL THEN
        avail := least(g.burst, g.tokens + extract(epoch FROM at - g.tokens_at) * g.rate_per_s);
        headroom := greatest(floor(avail), 0)::bigint;
    END IF;
    IF g.max_inflight IS NOT NULL THEN
        SELECT count(*) INTO running FROM (
            SELECT 1 FROM dispatcher.job_state s
             WHERE s.queue = ANY (ARRAY(SELECT m.name FROM dispatcher.queues m
                                         WHERE m.limit_group = grp))
               AND s.state = 'running'
             LIMIT g.max_inflight) j;
        headroom := least(headroom, greatest(g.max_inflight - running, 0));
    END IF;
    SELECT coalesce(sum(dispatcher.could_start(b, headroom)), 0) INTO reserved
      FROM dispatcher.queues b
     WHERE b.limit_group = grp AND b.group_priority < prio AND b.name <> q AND NOT b.paused;
    granted := least(wanted, greatest(headroom - reserved, 0))::integer;
    IF granted < 1 THEN
        wait_s := CASE
            WHEN g.rate_per_s IS NOT NULL AND avail < 1 THEN (1 - avail) / g.rate_per_s
            WHEN reserved > 0 THEN 0.05  -- better queues take the budget: look again soon
            ELSE 0.02 END;               -- the group's in-flight cap: as in claim_grant
    END IF;
    IF g.rate_per_s IS NOT NULL THEN
        UPDATE dispatcher.limit_groups SET tokens = avail - granted, tokens_at = at
         WHERE name = grp;
    END IF;
END
$$;

-- claim_grant as in migration 016, with the group's part and no permits for grouped queues.
CREATE OR REPLACE FUNCTION dispatcher.claim_grant(q text, wanted integer, OUT granted integer,
                                                  OUT wait_s float8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    slots    CONSTANT integer := 8;  -- claims that can run side by side on permits
    r        dispatcher.queues;
    at       timestamptz;
    avail    float8;
    headroom bigint := 2147483647;
    running  integer := 0;
    parked   integer := 0;
    got      integer;
    spare    integer;
    minted   integer := 0;
    a_slot   integer;
    held     integer[] := '{}';
    grp      record;
BEGIN
    granted := greatest(wanted, 0);
    PERFORM set_config('dispatcher.permit_slot', '', true);  -- for claim_settle: no slot
    SELECT * INTO r FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR (r.rate_per_s IS NULL AND r.max_inflight IS NULL AND r.limit_group IS NULL)
    THEN
        RETURN;  -- unlimited: no lock, claims of this queue run in parallel
    END IF;

    -- Permits parked in slots no other claim holds: no wait on the queue row. Take from as
    -- many idle slots as needed (fullest first); what the claim does not use goes back to the
    -- first of them (claim_settle). A queue in a limit group parks none (migration 024).
    IF granted > 0 AND r.limit_group IS NULL THEN
        minted := 0;  -- here: permits taken so far
        LOOP
            SELECT p.slot, p.n INTO a_slot, got FROM dispatcher.claim_permits p
             WHERE p.queue = q AND p.n > 0 AND p.slot <> ALL (held)
             ORDER BY p.n DESC, p.slot
             LIMIT 1
               FOR UPDATE SKIP LOCKED;
            EXIT WHEN NOT FOUND;
            got := least(got, granted - minted);
            UPDATE dispatcher.claim_permits SET n = n - got WHERE queue = q AND slot = a_slot;
            held := held || a_slot;
            minted := minted + got;
            EXIT WHEN minted >= granted;
        END LOOP;
        IF minted > 0 THEN
            granted := minted;
            PERFORM set_config('dispatcher.permit_slot', held[1]::text, true);
            RETURN;
        END IF;
        minted := 0;
    END IF;

    SELECT * INTO r FROM dispatcher.queues WHERE name = q FOR UPDATE;
    -- the clock read after the lock; never behind the last refill, so tokens never repeat
    at := greatest(r.tokens_at, clock_timestamp());
    -- one statement, one snapshot: a claim on a slot moves permits to running jobs atomically
    SELECT CASE WHEN r.max_inflight IS NULL THEN 0 ELSE (
               SELECT count(*) FROM (
                   SELECT 1 FROM dispatcher.job_state
                    WHERE queue = q AND state = 'running' LIMIT r.max_inflight) j) END,
           coalesce((SELECT sum(p.n) FROM dispatcher.claim_permits p WHERE p.queue = q), 0)
      INTO running, parked;
    IF r.rate_per_s IS NOT NULL THEN
        avail := least(r.burst - greatest(parked, r.permits_parked),
                       r.tokens + extract(epoch FROM at - r.tokens_at) * r.rate_per_s);
    END IF;
    IF parked > 0 AND granted > 0
       AND (avail < granted OR r.max_inflight - running - parked < granted) THEN
        -- short of headroom while slots nobody holds keep some: take those back first
        WITH idle AS (
            SELECT p.slot, p.n FROM dispatcher.claim_permits p
             WHERE p.queue = q AND p.n > 0
               FOR UPDATE SKIP LOCKED
        ), emptied AS (
            UPDATE dispatcher.claim_permits p SET n = 0
              FROM idle WHERE p.queue = q AND p.slot = idle.slot
            RETURNING idle.n
        )
        SELECT coalesce(sum(n), 0) INTO got FROM emptied;
        parked := parked - got;  -- the level is unchanged: parked permits become tokens again
        avail := avail + got;
    END IF;
    IF r.rate_per_s IS NOT NULL THEN
        headroom := greatest(floor(avail), 0)::bigint;
        granted := least(granted, headroom)::integer;
        IF granted < 1 THEN
            wait_s := (1 - avail) / r.rate_per_s;
        END IF;
    END IF;
    IF r.max_inflight IS NOT NULL THEN
        headroom := least(headroom, greatest(r.max_inflight - running - parked, 0));
        IF granted > 0 THEN
            granted := least(granted, headroom)::integer;
            IF granted < 1 AND wanted > 0 THEN
                -- full across all daemons: a slot frees when any of them completes a job, which
                -- no wake-up tells us about, so look again soon (one short statement)
                wait_s := 0.02;
            END IF;
        END IF;
    END IF;

    -- the group's part (migration 024): a start needs the queue's limits and the group's
    IF r.limit_group IS NOT NULL AND granted > 0 THEN
        SELECT * INTO grp FROM dispatcher.group_grant(r.limit_group, q, r.group_priority, granted);
        granted := grp.granted;
        wait_s := coalesce(wait_s, grp.wait_s);
    END IF;

    -- park one more claim's worth in each idle empty slot while the headroom allows it
    spare := least(headroom - granted, slots::bigint * wanted)::integer;
    IF wanted > 0 AND granted = wanted AND spare >= wanted AND r.limit_group IS NULL THEN
        INSERT INTO dispatcher.claim_permits (queue, slot)
        SELECT q, s FROM generate_series(0, slots - 1) s
         WHERE NOT EXISTS (SELECT 1 FROM dispatcher.claim_permits p WHERE p.queue = q)
            ON CONFLICT DO NOTHING;
        WITH empty AS (
            SELECT p.slot FROM dispatcher.claim_permits p
             WHERE p.queue = q AND p.n = 0
             ORDER BY p.slot
             LIMIT spare / wanted
               FOR UPDATE SKIP LOCKED
        ), filled AS (
            UPDATE dispatcher.claim_permits p SET n = wanted
              FROM empty WHERE p.queue = q AND p.slot = empty.slot
            RETURNING 1
        )
        SELECT count(*) * wanted INTO minted FROM filled;
    END IF;
    UPDATE dispatcher.queues
       SET tokens = CASE WHEN r.rate_per_s IS NULL THEN tokens ELSE avail - granted - minted END,
           tokens_at = CASE WHEN r.rate_per_s IS NULL THEN tokens_at ELSE at END,
           permits_parked = parked + minted
     WHERE name = q;
END
$$;

-- Give back the permits or tokens of a grant the claim did not use, where they came from (the
-- queue's slot or bucket, and its group's bucket); returns `wait_s` unchanged, so the claim can
-- call it from the row it always returns.
CREATE OR REPLACE FUNCTION dispatcher.claim_settle(q text, granted integer, started integer,
                                                   wait_s float8)
RETURNS float8
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    first_slot text := nullif(current_setting('dispatcher.permit_slot', true), '');
BEGIN
    IF granted > started THEN
        IF first_slot IS NOT NULL THEN  -- this transaction holds that slot's row
            UPDATE dispatcher.claim_permits SET n = n + (granted - started)
             WHERE queue = q AND slot = first_slot::integer;
        ELSE
            UPDATE dispatcher.queues
               SET tokens = least(burst, tokens + (granted - started))
             WHERE name = q AND rate_per_s IS NOT NULL;
            -- the queue row is locked by this claim (a grouped queue never claims on a slot)
            UPDATE dispatcher.limit_groups g
               SET tokens = least(g.burst, g.tokens + (granted - started))
              FROM dispatcher.queues m
             WHERE m.name = q AND g.name = m.limit_group AND g.rate_per_s IS NOT NULL;
        END IF;
    END IF;
    RETURN wait_s;
END
$$;

-- Part 3: per-key limits (issue 22 point 4; seed 003: a partner API that answers 429 per
-- customer account). Every concurrency key of a queue (migration 023: the job's tenant unless
-- the job names another) gets the queue's key_max_inflight, key_rate_per_s and key_burst, all
-- daemons together, on both transports; dispatcher.key_limits overrides them for single keys
-- (set at run time, persisted).
--
-- How a claim honours them without head-of-line blocking, in the same statement:
--   1. claim_pick skips the ready jobs of keys at their limit (keys_at_limit: running jobs
--      counted per key, buckets below one token), so a blocked key never takes a place in the
--      claim that another key's job could have;
--   2. of the jobs picked, key_take keeps for each key at most what it may start now, deciding
--      under the key's row lock (dispatcher.key_state, taken in key order) with the running
--      jobs counted after the lock, so two daemons never both take a key's last slot; it takes
--      the kept jobs' tokens from the keys' buckets. Jobs not kept stay ready (in process) or
--      are refused back to the relay, published again shortly (RabbitMQ: a held delivery would
--      hold a prefetch place other keys need).
-- A queue without key limits and without overrides pays one primary-key probe of its row.
ALTER TABLE dispatcher.queues
    ADD COLUMN key_max_inflight integer
        CONSTRAINT queues_key_max_inflight_min CHECK (key_max_inflight >= 1),
    ADD COLUMN key_rate_per_s float8 CONSTRAINT queues_key_rate_positive CHECK (key_rate_per_s > 0),
    ADD COLUMN key_burst integer CONSTRAINT queues_key_burst_min CHECK (key_burst >= 1),
    ADD CONSTRAINT queues_key_rate_needs_a_burst
        CHECK (key_rate_per_s IS NULL OR key_burst IS NOT NULL);

-- One key's limits instead of its queue's (NULL: the queue's value for that one).
CREATE TABLE dispatcher.key_limits (
    queue        text NOT NULL REFERENCES dispatcher.queues (name) ON DELETE CASCADE,
    key          text NOT NULL CONSTRAINT key_limits_key_length CHECK (length(key) BETWEEN 1 AND 200),
    max_inflight integer CONSTRAINT key_limits_max_inflight_min CHECK (max_inflight >= 1),
    rate_per_s   float8 CONSTRAINT key_limits_rate_positive CHECK (rate_per_s > 0),
    burst        integer CONSTRAINT key_limits_burst_min CHECK (burst >= 1),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key),
    CONSTRAINT key_limits_limit_something
        CHECK (max_inflight IS NOT NULL OR rate_per_s IS NOT NULL OR burst IS NOT NULL)
);

-- A limited key's lock row and bucket, made by the first claim that starts one of its jobs.
CREATE TABLE dispatcher.key_state (
    queue     text NOT NULL,
    key       text NOT NULL,
    tokens    float8 NOT NULL,
    tokens_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
) WITH (fillfactor = 50);  -- every claim of a limited key rewrites its row: keep it HOT

-- The running jobs of a queue by key: keys_at_limit and key_take count them.
CREATE INDEX jobs_running_key ON dispatcher.job_state (queue, concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- The limits of key `k` of queue row `qq`: the override's, else the queue's; a rate without a
-- burst (an override of the rate alone) gets one second's worth.
CREATE FUNCTION dispatcher.key_limits_of(qq dispatcher.queues, k text, OUT max_inflight integer,
                                         OUT rate_per_s float8, OUT burst integer)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(o.max_inflight, qq.key_max_inflight),
           coalesce(o.rate_per_s, qq.key_rate_per_s),
           coalesce(o.burst, CASE WHEN o.rate_per_s IS NOT NULL
                                  THEN greatest(1, ceil(o.rate_per_s))::integer END,
                    qq.key_burst)
      FROM (SELECT 1) one
      LEFT JOIN dispatcher.key_limits o ON o.queue = qq.name AND o.key = k
$$;

-- Whether queue row `qq` limits any key (its settings, or an override).
CREATE FUNCTION dispatcher.keys_limited(qq dispatcher.queues) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT qq.key_max_inflight IS NOT NULL OR qq.key_rate_per_s IS NOT NULL
        OR EXISTS (SELECT 1 FROM dispatcher.key_limits o WHERE o.queue = qq.name)
$$;

-- The keys of queue `q` that may start nothing now: as many running as their cap, or less
-- than one token in their bucket. Read without locks: the pick skips them; key_take decides.
CREATE FUNCTION dispatcher.keys_at_limit(q text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    qq dispatcher.queues;
BEGIN
    SELECT * INTO qq FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR NOT dispatcher.keys_limited(qq) THEN
        RETURN '{}';
    END IF;
    RETURN ARRAY(
        SELECT r.key FROM (
            SELECT s.concurrency_key AS key, count(*) AS n FROM dispatcher.job_state s
             WHERE s.queue = q AND s.state = 'running' AND s.concurrency_key IS NOT NULL
             GROUP BY s.concurrency_key) r
         CROSS JOIN LATERAL dispatcher.key_limits_of(qq, r.key) l
         WHERE r.n >= l.max_inflight
        UNION
        SELECT k.key FROM dispatcher.key_state k
         CROSS JOIN LATERAL dispatcher.key_limits_of(qq, k.key) l
         WHERE k.queue = q AND l.rate_per_s IS NOT NULL
           AND least(l.burst, k.tokens + extract(epoch FROM clock_timestamp() - k.tokens_at)
                              * l.rate_per_s) < 1);
END
$$;

-- Of the jobs `ids` of queue `q` (in claim order), those their keys may start now, in the
-- same order; takes their tokens. Locks the key rows involved until the claim commits.
CREATE FUNCTION dispatcher.key_take(q text, ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    qq   dispatcher.queues;
    keys text[];
    kept bigint[];
BEGIN
    SELECT * INTO qq FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR cardinality(ids) = 0 OR NOT dispatcher.keys_limited(qq) THEN
        RETURN ids;
    END IF;
    -- the limited keys among the jobs, their rows made and locked in key order
    SELECT array_agg(DISTINCT s.concurrency_key ORDER BY s.concurrency_key) INTO keys
      FROM dispatcher.job_state s
     CROSS JOIN LATERAL dispatcher.key_limits_of(qq, s.concurrency_key) l
     WHERE s.id = ANY (ids) AND s.concurrency_key IS NOT NULL
       AND (l.max_inflight IS NOT NULL OR l.rate_per_s IS NOT NULL);
    IF keys IS NULL THEN
        RETURN ids;
    END IF;
    INSERT INTO dispatcher.key_state (queue, key, tokens)
    SELECT q, k, coalesce(l.burst, 0) FROM unnest(keys) k
     CROSS JOIN LATERAL dispatcher.key_limits_of(qq, k) l
        ON CONFLICT DO NOTHING;
    PERFORM 1 FROM dispatcher.key_state
     WHERE queue = q AND key = ANY (keys) ORDER BY key FOR UPDATE;
    -- each key's room, from its running jobs counted after the lock (a fresh snapshot)
    WITH room AS (
        SELECT k.key, l.rate_per_s,
               least(l.burst, k.tokens + extract(epoch FROM clock_timestamp() - k.tokens_at)
                              * l.rate_per_s) AS level,
               least(coalesce(floor(least(l.burst, k.tokens + extract(epoch FROM
                                  clock_timestamp() - k.tokens_at) * l.rate_per_s)), 2147483647),
                     coalesce(l.max_inflight - (
                         SELECT count(*) FROM dispatcher.job_state s
                          WHERE s.queue = q AND s.state = 'running'
                            AND s.concurrency_key = k.key), 2147483647)) AS n
          FROM dispatcher.key_state k
         CROSS JOIN LATERAL dispatcher.key_limits_of(qq, k.key) l
         WHERE k.queue = q AND k.key = ANY (keys)
    ), ranked AS (
        SELECT u.id, u.pos, r.key, r.n,
               row_number() OVER (PARTITION BY s.concurrency_key ORDER BY u.pos) AS rank
          FROM unnest(ids) WITH ORDINALITY AS u(id, pos)
          JOIN dispatcher.job_state s ON s.id = u.id
          LEFT JOIN room r ON r.key = s.concurrency_key
    ), taken AS (
        UPDATE dispatcher.key_state k
           SET tokens = r.level - t.n, tokens_at = clock_timestamp()
          FROM (SELECT key, count(*) AS n FROM ranked
                 WHERE key IS NOT NULL AND rank <= n GROUP BY key) t,
               room r
         WHERE k.queue = q AND k.key = t.key AND r.key = t.key AND r.rate_per_s IS NOT NULL
    )
    SELECT coalesce(array_agg(id ORDER BY pos), '{}') INTO kept
      FROM ranked WHERE key IS NULL OR rank <= n;
    RETURN kept;
END
$$;

-- claim_pick as in migration 023, skipping the jobs of keys at their limit (`blocked`): the
-- tenant walk passes over tenants whose ready jobs all belong to blocked keys (its probe reads
-- past their entries), and the pick within a tenant takes none of them.
CREATE OR REPLACE FUNCTION dispatcher.claim_pick(q text, wanted integer, caps text[],
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
    blocked   text[];      -- keys at their limit (migration 024): their jobs are skipped
BEGIN
    IF wanted < 1 OR EXISTS (SELECT 1 FROM dispatcher.queues x WHERE x.name = q AND x.paused) THEN
        RETURN;  -- a paused queue offers nothing
    END IF;
    blocked := dispatcher.keys_at_limit(q);
    LOOP
        SELECT min(s.priority) INTO lvl FROM dispatcher.job_state s
         WHERE s.queue = q AND s.state = 'ready' AND (lvl IS NULL OR s.priority > lvl);
        EXIT WHEN lvl IS NULL;
        -- the walk: the tenants after the cursor, then from the first name round to it
        WITH RECURSIVE onward AS (
            (SELECT s.tenant FROM dispatcher.job_state s
              WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (blocked))
                AND (lvl IS DISTINCT FROM after_priority OR s.tenant > after_tenant)
              ORDER BY s.tenant LIMIT 1)
            UNION ALL
            SELECT n.tenant FROM onward o
             CROSS JOIN LATERAL (
                   SELECT s.tenant FROM dispatcher.job_state s
                    WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (blocked))
                      AND s.tenant > o.tenant
                    ORDER BY s.tenant LIMIT 1) n
        ), round_ AS (
            (SELECT s.tenant FROM dispatcher.job_state s
              WHERE lvl = after_priority AND s.queue = q AND s.state = 'ready'
                AND s.priority = lvl
                AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (blocked)) AND s.tenant <= after_tenant
              ORDER BY s.tenant LIMIT 1)
            UNION ALL
            SELECT n.tenant FROM round_ o
             CROSS JOIN LATERAL (
                   SELECT s.tenant FROM dispatcher.job_state s
                    WHERE s.queue = q AND s.state = 'ready' AND s.priority = lvl
                AND (s.concurrency_key IS NULL OR s.concurrency_key <> ALL (blocked))
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

-- How soon a claim of queue `q` should look again for jobs its keys held back: NULL when no key
-- is at its limit (nothing held), else a short poll (a freed key slot wakes nobody).
CREATE FUNCTION dispatcher.key_wait_s(q text) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN cardinality(dispatcher.keys_at_limit(q)) > 0 THEN 0.05 END
$$;
