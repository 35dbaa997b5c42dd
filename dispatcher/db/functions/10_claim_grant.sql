-- How many jobs a claim of queue `q` may start (`granted`), and how long to wait when none
-- (`wait_s`): the global limits (rate_per_s with burst, max_inflight) held across every daemon
-- sharing the database. Permits parked in dispatcher.claim_permits are taken first, without
-- the queue row's lock; otherwise the row is locked, the bucket refilled from the database
-- clock, running jobs counted in the state table, and a share parked for the next claims. A
-- queue in a limit group takes from its group too (group_grant) and parks nothing.
-- Why a function, and why the limits hold: migrations 013, 016 and 024.
-- claim_grant as in migration 016, with the group's part and no permits for grouped queues.
CREATE OR REPLACE FUNCTION dispatcher.claim_grant(q text, wanted integer, OUT granted integer,
                                                  OUT wait_s float8)
LANGUAGE plpgsql VOLATILE
-- planned once per connection and kept, read by index (10_claim_pick.sql says why)
SET plan_cache_mode = auto SET enable_seqscan = off
AS $$
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
