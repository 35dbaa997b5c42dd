-- Global limits without putting every claim of a queue in one line (issue 13).
--
-- Measured before (tests/bench/bench_scaleout.py, 3 daemons, a queue limited to 1,000,000/s
-- and 2,000 or 100,000 in flight): about half of the claim statement's samples in
-- pg_stat_activity waited on a lock (Lock:transactionid, Lock:tuple). claim_grant (013) locks
-- the queue's registry row first thing in every claim and the claim holds the lock until it
-- commits, so the claims of all daemons ran one after another: all daemons together could not
-- claim faster than one claim statement after the other.
--
-- Now headroom is handed out ahead as *permits*: one permit is one start token and one in-flight
-- slot, taken from the queue's limits when it is minted. A queue has a few permit slots (rows
-- of dispatcher.claim_permits). A claim first takes permits from slots no other claim holds
-- (FOR UPDATE SKIP LOCKED): it locks those slots only, never the queue row, so claims on
-- different slots run side by side. A claim that finds no idle slot with permits locks the
-- queue row as in 013, refills the bucket and grants itself what it wants; when the headroom
-- left is at least that much again, it also parks one such share in each idle empty slot for
-- the claims that come next. Near the limits nothing is left to park and every claim goes
-- through the queue row, as in 013. Such a claim, short of headroom, first takes back the
-- permits of slots nobody holds.
--
-- Why the limits still hold:
--   in flight  running jobs + parked permits <= max_inflight whenever permits are minted, both
--              counted in one statement (one snapshot) under the row lock. A claim on a slot
--              turns permits into running jobs in one commit, so that sum never grows outside
--              the row lock; completions only lower it.
--   rate       permits are minted from the bucket's tokens: tokens + parked permits is the
--              bucket's level, which only refilling raises (at rate_per_s, up to the burst).
--              Parked permits are spent outside the row lock, so the refill credited at a claim
--              is capped at burst - (the most permits parked since the last refill), which is
--              what queues.permits_parked records: the level never passes the burst, so starts
--              in any window stay within rate x window + burst.
--   unused     a claim gives back what it did not start where it took it (its first slot, or
--              the bucket), in the same statement (claim_settle, as in 013)
-- Changing a queue's limits empties its slots (trigger below), so a lowered limit applies at
-- once. Running jobs are counted in the state table, as in 015's grant (jobs_running_queue).
CREATE TABLE dispatcher.claim_permits (
    queue text NOT NULL,
    slot  integer NOT NULL,
    n     integer NOT NULL DEFAULT 0 CHECK (n >= 0),
    PRIMARY KEY (queue, slot)
) WITH (fillfactor = 50);  -- every claim on permits rewrites a row: keep the updates HOT

-- Permits parked after the last claim that locked the row: until the next one, no more are.
ALTER TABLE dispatcher.queues ADD COLUMN permits_parked integer NOT NULL DEFAULT 0;

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
BEGIN
    granted := greatest(wanted, 0);
    PERFORM set_config('dispatcher.permit_slot', '', true);  -- for claim_settle: no slot
    SELECT * INTO r FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR (r.rate_per_s IS NULL AND r.max_inflight IS NULL) THEN
        RETURN;  -- unlimited: no lock, claims of this queue run in parallel
    END IF;

    -- Permits parked in slots no other claim holds: no wait on the queue row. Take from as
    -- many idle slots as needed (fullest first); what the claim does not use goes back to the
    -- first of them (claim_settle).
    IF granted > 0 THEN
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

    -- park one more claim's worth in each idle empty slot while the headroom allows it
    spare := least(headroom - granted, slots::bigint * wanted)::integer;
    IF wanted > 0 AND granted = wanted AND spare >= wanted THEN
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

-- Give back the permits or tokens of a grant the claim did not use, where they came from;
-- returns `wait_s` unchanged, so the claim can call it from the row it always returns.
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
        END IF;
    END IF;
    RETURN wait_s;
END
$$;

-- New limits apply at once: the permits parked under the old ones are dropped (the change waits
-- for a claim that holds a slot, then empties that slot too).
CREATE FUNCTION dispatcher.drop_claim_permits() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE dispatcher.claim_permits SET n = 0 WHERE queue = NEW.name AND n > 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER queues_limits_changed
    AFTER UPDATE OF rate_per_s, burst, max_inflight ON dispatcher.queues
    FOR EACH ROW
    WHEN ((OLD.rate_per_s, OLD.burst, OLD.max_inflight)
          IS DISTINCT FROM (NEW.rate_per_s, NEW.burst, NEW.max_inflight))
    EXECUTE FUNCTION dispatcher.drop_claim_permits();
