-- Limit groups (migration 024): what a claim of a queue in a group may take from the group.

-- What queue `b` could start at once, at most `cap`: its ready jobs, within its own limits
-- (read, not locked: an estimate for the reserve, never a grant).
CREATE OR REPLACE FUNCTION dispatcher.could_start(b dispatcher.queues, cap bigint) RETURNS bigint
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
CREATE OR REPLACE FUNCTION dispatcher.group_grant(grp text, q text, prio integer, wanted integer,
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
