-- Per-key limits (migration 024): each concurrency key's limits, the keys at their limit, and
-- what a claim's keys may start.

-- The limits of key `k` of queue row `qq`: the override's, else the queue's; a rate without a
-- burst (an override of the rate alone) gets one second's worth.
CREATE OR REPLACE FUNCTION dispatcher.key_limits_of(qq dispatcher.queues, k text)
RETURNS TABLE (max_inflight integer, rate_per_s float8, burst integer)
-- one row always; a set-returning SQL function so a LATERAL call is inlined into its caller's
-- plan: one join, not a function call per key (12.6 ms for 100 keys before, under EXPLAIN)
LANGUAGE sql STABLE ROWS 1 AS $$
    SELECT coalesce(o.max_inflight, qq.key_max_inflight),
           coalesce(o.rate_per_s, qq.key_rate_per_s),
           coalesce(o.burst, CASE WHEN o.rate_per_s IS NOT NULL
                                  THEN greatest(1, ceil(o.rate_per_s))::integer END,
                    qq.key_burst)
      FROM (SELECT 1) one
      LEFT JOIN dispatcher.key_limits o ON o.queue = qq.name AND o.key = k
$$;

-- How old a key's kept count of running jobs may grow before it is counted again from the jobs
-- (migration 043): a drift the kept count cannot see (an end no statement counted) lasts at
-- most this long. Each key is counted once per this time at most, by its next claim.
CREATE OR REPLACE FUNCTION dispatcher.key_recount_after() RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT interval '10 seconds'
$$;

-- The keys of queue `q` that may start nothing now: as many running as their cap, or less
-- than one token in their bucket. Read without locks: the pick skips them; key_take decides.
-- One scan of the queue's key rows, each with its running jobs (starts less ends, migration
-- 040; a key whose count is not known, or older than key_recount_after(), is left to key_take,
-- which counts it again), and only when some key could be at its cap (a cap below the queue's
-- own in-flight cap) or has a rate. A queue without overrides (the common case) gives every
-- key the queue's limits without a probe of dispatcher.key_limits per key.
CREATE OR REPLACE FUNCTION dispatcher.keys_at_limit(q text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    qq      dispatcher.queues;
    o       record;  -- the queue's overrides: how many, their smallest cap, whether any has a rate
    full_   text[] := '{}';
BEGIN
    SELECT * INTO qq FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND THEN
        RETURN '{}';
    END IF;
    SELECT count(*) AS n, min(x.max_inflight) AS min_cap,
           coalesce(bool_or(x.rate_per_s IS NOT NULL), false) AS any_rate
      INTO o FROM dispatcher.key_limits x WHERE x.queue = q;
    IF qq.key_max_inflight IS NULL AND qq.key_rate_per_s IS NULL AND o.n = 0 THEN
        RETURN '{}';
    END IF;
    IF qq.key_rate_per_s IS NOT NULL OR o.any_rate
       OR least(qq.key_max_inflight, o.min_cap) < coalesce(qq.max_inflight, 2147483647) THEN
        IF o.n = 0 THEN
            full_ := ARRAY(
                SELECT k.key FROM dispatcher.key_state k
                  LEFT JOIN dispatcher.key_done d ON d.queue = k.queue AND d.key = k.key
                 WHERE k.queue = q
                   AND ((k.counted_at >= now() - dispatcher.key_recount_after()
                         AND k.running_seen - coalesce(d.n, 0) >= qq.key_max_inflight)
                        OR least(qq.key_burst,
                                 k.tokens + extract(epoch FROM clock_timestamp() - k.tokens_at)
                                            * qq.key_rate_per_s) < 1));
        ELSE
            full_ := ARRAY(
                SELECT k.key FROM dispatcher.key_state k
                 CROSS JOIN LATERAL dispatcher.key_limits_of(qq, k.key) l
                  LEFT JOIN dispatcher.key_done d ON d.queue = k.queue AND d.key = k.key
                 WHERE k.queue = q
                   AND ((k.counted_at >= now() - dispatcher.key_recount_after()
                         AND k.running_seen - coalesce(d.n, 0) >= l.max_inflight)
                        OR least(l.burst, k.tokens + extract(epoch FROM clock_timestamp()
                                                             - k.tokens_at) * l.rate_per_s) < 1));
        END IF;
    END IF;
    -- for the claim's marker (key_wait_s): whether this claim found keys at their limit
    PERFORM set_config('dispatcher.keys_full', (cardinality(full_) > 0)::text, true);
    RETURN full_;
END
$$;

-- Of the jobs `ids` of queue `q` with their concurrency keys `keys` (in claim order), those
-- their keys may start now, in the same order; takes their tokens. Locks the rows of the
-- limited keys among them, in key order, until the claim commits, so two claimers never both
-- take a key's last slot. A key's room is its cap less its running jobs: its starts
-- (running_seen) less its ends (key_done, read without a lock: an end not seen yet only leaves
-- less room), both kept by the trigger of 30_key_running.sql. A key whose count is not known
-- (its first claim, or its limits changed) or older than key_recount_after() has its running
-- jobs counted again, here, under its lock.
--
-- With `counts_starts` (claim_ready, whose statement starts every job kept here or ends it
-- expired) the claim's starts are added here, in the same write as the tokens: one write per
-- key per claim, and the trigger, told so by the setting dispatcher.key_starts_counted, does
-- not add them again (it counts the expired ones as ends). Without it (the relay's claim, which
-- may find a kept job taken by another claim meanwhile) the trigger adds the starts it sees.
-- When every key has room for all its jobs here (limits that do not bind), `ids` come back
-- as they are, without ranking the jobs within their keys.
CREATE OR REPLACE FUNCTION dispatcher.key_take(q text, ids bigint[], keys text[],
                                    counts_starts boolean) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    big     CONSTANT bigint := 2147483647;
    qq      dispatcher.queues;
    overridden boolean;
    limited text[];    -- the limited keys among the jobs, in key order
    wants   bigint[];  -- how many of the jobs each has
    caps    integer[];
    rates   float8[];
    bursts  integer[];
    present integer;   -- how many of their rows exist
    fresh   integer;   -- how many of those have a count younger than key_recount_after()
    short_keys  text[];    -- the keys that may start fewer than they have here
    short_rooms bigint[];  -- and how many they may start
BEGIN
    SELECT * INTO qq FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR cardinality(ids) = 0 THEN
        RETURN ids;
    END IF;
    overridden := EXISTS (SELECT 1 FROM dispatcher.key_limits o WHERE o.queue = q);
    IF qq.key_max_inflight IS NULL AND qq.key_rate_per_s IS NULL AND NOT overridden THEN
        RETURN ids;
    END IF;
    -- the limited keys among the jobs, with their number of jobs and their limits, once per key
    IF overridden THEN
        SELECT array_agg(d.k ORDER BY d.k), array_agg(d.n ORDER BY d.k),
               array_agg(l.max_inflight ORDER BY d.k), array_agg(l.rate_per_s ORDER BY d.k),
               array_agg(l.burst ORDER BY d.k)
          INTO limited, wants, caps, rates, bursts
          FROM (SELECT k, count(*) AS n FROM unnest(keys) k WHERE k IS NOT NULL GROUP BY k) d
         CROSS JOIN LATERAL dispatcher.key_limits_of(qq, d.k) l
         WHERE l.max_inflight IS NOT NULL OR l.rate_per_s IS NOT NULL;
    ELSE
        -- no override: every key has the queue's limits
        SELECT array_agg(d.k ORDER BY d.k), array_agg(d.n ORDER BY d.k)
          INTO limited, wants
          FROM (SELECT k, count(*) AS n FROM unnest(keys) k WHERE k IS NOT NULL GROUP BY k) d;
        IF limited IS NOT NULL THEN
            caps := array_fill(qq.key_max_inflight, ARRAY[cardinality(limited)]);
            rates := array_fill(qq.key_rate_per_s, ARRAY[cardinality(limited)]);
            bursts := array_fill(qq.key_burst, ARRAY[cardinality(limited)]);
        END IF;
    END IF;
    IF limited IS NULL THEN
        RETURN ids;
    END IF;
    FOR pass_ IN 1..2 LOOP
        -- the keys' rows, locked in key order
        SELECT count(*), count(*) FILTER (WHERE k.running_seen IS NOT NULL
                                            AND k.counted_at >= now()
                                                               - dispatcher.key_recount_after())
          INTO present, fresh
          FROM (SELECT k.running_seen, k.counted_at FROM dispatcher.key_state k
                 WHERE k.queue = q AND k.key = ANY (limited)
                 ORDER BY k.key FOR UPDATE) k;
        EXIT WHEN present = cardinality(limited) OR pass_ = 2;
        -- a key's first claim makes its row (its count not known yet)
        INSERT INTO dispatcher.key_state (queue, key, tokens)
        SELECT q, x.key, coalesce(x.burst, 0) FROM unnest(limited, bursts) AS x(key, burst)
            ON CONFLICT DO NOTHING;
    END LOOP;
    IF fresh < present THEN
        -- counts not known or old: the running jobs of these keys, counted in one scan of the
        -- queue's running jobs (jobs_running, its prefix), all of them while it is read anyway (plus
        -- the key's ends counted so far, read in the same snapshot, taken after the locks: an
        -- end that commits later was counted running here and is subtracted then)
        UPDATE dispatcher.key_state k
           SET running_seen = coalesce(c.n, 0) + coalesce(d.n, 0), counted_at = now()
          FROM unnest(limited) AS x(key)
          LEFT JOIN (SELECT s.concurrency_key AS key, count(*) AS n
                       FROM dispatcher.job_state s
                      WHERE s.queue = q AND s.state = 'running'
                        AND s.concurrency_key = ANY (limited)
                      GROUP BY s.concurrency_key) c ON c.key = x.key
          LEFT JOIN dispatcher.key_done d ON d.queue = q AND d.key = x.key
         WHERE k.queue = q AND k.key = x.key;
    END IF;
    -- one statement: each key's room (its bucket's level; its cap less its running jobs; none
    -- without its row, were one to vanish), one write per key that starts some (its tokens,
    -- and with counts_starts its starts), and the keys that may start fewer than they have here
    WITH room AS (
        SELECT x.key, x.want, x.rate, lv.level,
               CASE WHEN k.key IS NULL THEN 0
                    ELSE greatest(0, least(coalesce(floor(lv.level)::bigint, big),
                                           coalesce(x.cap - (k.running_seen - coalesce(d.n, 0)),
                                                    big))) END AS n
          FROM unnest(limited, wants, caps, rates, bursts) AS x(key, want, cap, rate, burst)
          LEFT JOIN dispatcher.key_state k ON k.queue = q AND k.key = x.key
          LEFT JOIN dispatcher.key_done d ON d.queue = q AND d.key = x.key
         CROSS JOIN LATERAL (
               SELECT least(x.burst, k.tokens + extract(epoch FROM clock_timestamp()
                                                        - k.tokens_at) * x.rate) AS level) lv
    ), taken AS (
        UPDATE dispatcher.key_state k
           SET tokens = CASE WHEN r.rate IS NULL THEN k.tokens
                             ELSE r.level - least(r.want, r.n) END,
               tokens_at = CASE WHEN r.rate IS NULL THEN k.tokens_at ELSE clock_timestamp() END,
               running_seen = CASE WHEN counts_starts THEN k.running_seen + least(r.want, r.n)
                                   ELSE k.running_seen END
          FROM room r
         WHERE k.queue = q AND k.key = r.key AND least(r.want, r.n) > 0
           AND (r.rate IS NOT NULL OR counts_starts)
    )
    SELECT array_agg(r.key), array_agg(r.n) INTO short_keys, short_rooms
      FROM room r WHERE r.n < r.want;
    IF counts_starts THEN
        PERFORM set_config('dispatcher.key_starts_counted', 'on', true);
    END IF;
    IF short_keys IS NULL THEN
        RETURN ids;  -- every key has room for all its jobs here
    END IF;
    -- the first jobs of each short key, as many as it may start, in claim order
    RETURN (SELECT coalesce(array_agg(u.id ORDER BY u.pos), '{}')
              FROM (SELECT u.id, u.pos, u.k,
                           row_number() OVER (PARTITION BY u.k ORDER BY u.pos) AS rank
                      FROM unnest(ids, keys) WITH ORDINALITY AS u(id, k, pos)) u
              LEFT JOIN unnest(short_keys, short_rooms) AS s(key, n) ON s.key = u.k
             WHERE s.key IS NULL OR u.rank <= s.n);
END
$$;

-- The same, the trigger counting the starts (the relay's claim).
CREATE OR REPLACE FUNCTION dispatcher.key_take(q text, ids bigint[], keys text[])
RETURNS bigint[]
LANGUAGE sql VOLATILE AS $$
    SELECT dispatcher.key_take(q, ids, keys, false)
$$;

-- How soon a claim should look again for jobs its keys held back: NULL when the pick found
-- no key at its limit (keys_at_limit said so in this transaction), else a short poll (a freed
-- key slot wakes nobody).
CREATE OR REPLACE FUNCTION dispatcher.key_wait_s() RETURNS float8
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN current_setting('dispatcher.keys_full', true) = 'true' THEN 0.05 END
$$;
