-- Global limits: a queue's start rate (token bucket) and in-flight cap hold across every daemon
-- sharing this database, without a leader. The bucket lives in the queue's registry row; every
-- claim (claim_ready, claim_delivered) asks `claim_grant` how many it may start, which locks that
-- row, refills the bucket from the database clock, counts the queue's running jobs, grants
-- min(wanted, tokens, max_inflight - running) and takes the tokens; `claim_settle` gives back the
-- tokens of jobs the claim did not start (too few ready, duplicates). Both run inside the claim
-- statement, so the row lock is held until the claim commits: claims of one limited queue are
-- serialised across daemons (each is one short statement), everything else runs in parallel.
--
-- Why functions: a statement's snapshot is taken before it waits for the row lock, so a count
-- of running jobs written in the claim itself would miss the jobs another daemon's claim started
-- while we waited. A volatile function's statements each take a fresh snapshot, after the lock.
ALTER TABLE dispatcher.queues
    -- NULL: no limit. Written from the configuration at start (upsert_queue).
    ADD COLUMN rate_per_s float8 CHECK (rate_per_s > 0),
    ADD COLUMN burst integer CHECK (burst >= 1),
    ADD COLUMN max_inflight integer CHECK (max_inflight >= 1),
    ADD COLUMN tokens float8 NOT NULL DEFAULT 0,
    ADD COLUMN tokens_at timestamptz NOT NULL DEFAULT now();

-- The running jobs of one queue, counted by every claim of a queue with an in-flight cap (at most
-- max_inflight index entries).
CREATE INDEX jobs_running_queue ON dispatcher.jobs (queue) WHERE state = 'running';

CREATE FUNCTION dispatcher.claim_grant(q text, wanted integer, OUT granted integer,
                                       OUT wait_s float8)
LANGUAGE plpgsql VOLATILE AS $$
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

-- Give back the tokens of a grant the claim did not use; returns `wait_s` unchanged, so the
-- claim can call it from the row it always returns.
CREATE FUNCTION dispatcher.claim_settle(q text, granted integer, started integer, wait_s float8)
RETURNS float8
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF granted > started THEN
        UPDATE dispatcher.queues
           SET tokens = least(burst, tokens + (granted - started))
         WHERE name = q AND rate_per_s IS NOT NULL;
    END IF;
    RETURN wait_s;
END
$$;
