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

-- Whether queue row `qq` limits any key (its settings, or an override).
CREATE OR REPLACE FUNCTION dispatcher.keys_limited(qq dispatcher.queues) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT qq.key_max_inflight IS NOT NULL OR qq.key_rate_per_s IS NOT NULL
        OR EXISTS (SELECT 1 FROM dispatcher.key_limits o WHERE o.queue = qq.name)
$$;

-- The smallest in-flight cap any key of queue row `qq` has (NULL: none), and whether any key
-- has a rate: what keys_at_limit and key_take can skip.
CREATE OR REPLACE FUNCTION dispatcher.key_bounds(qq dispatcher.queues, OUT min_cap integer,
                                      OUT any_rate boolean)
LANGUAGE sql STABLE AS $$
    SELECT least(qq.key_max_inflight, min(o.max_inflight)),
           qq.key_rate_per_s IS NOT NULL OR bool_or(o.rate_per_s IS NOT NULL)
      FROM dispatcher.key_limits o WHERE o.queue = qq.name
$$;

-- The keys of queue `q` that may start nothing now: as many running as their cap, or less
-- than one token in their bucket. Read without locks: the pick skips them; key_take decides.
-- One scan of the queue's key rows, each with its running jobs (starts less ends, migration
-- 040; a key whose count is not known yet is left to key_take), and only when some
-- key could be at its cap (a cap below the queue's own in-flight cap) or has a rate.
CREATE OR REPLACE FUNCTION dispatcher.keys_at_limit(q text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    qq      dispatcher.queues;
    b       record;
    full_   text[] := '{}';
BEGIN
    SELECT * INTO qq FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR NOT dispatcher.keys_limited(qq) THEN
        RETURN '{}';
    END IF;
    b := dispatcher.key_bounds(qq);
    IF b.any_rate OR b.min_cap < coalesce(qq.max_inflight, 2147483647) THEN
        full_ := ARRAY(
            SELECT k.key FROM dispatcher.key_state k
             CROSS JOIN LATERAL dispatcher.key_limits_of(qq, k.key) l
              LEFT JOIN dispatcher.key_done d ON d.queue = k.queue AND d.key = k.key
             WHERE k.queue = q
               AND (k.running_seen - coalesce(d.n, 0) >= l.max_inflight
                    OR least(l.burst, k.tokens + extract(epoch FROM clock_timestamp()
                                                         - k.tokens_at) * l.rate_per_s) < 1));
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
-- less room), both kept by the trigger of 30_key_running.sql (the claim's own starts are added
-- at the end of the claim's statement); a key whose count is not known (its first claim, or
-- its limits changed) has its running jobs counted once, here, under its lock.
CREATE OR REPLACE FUNCTION dispatcher.key_take(q text, ids bigint[], keys text[]) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    big     CONSTANT bigint := 2147483647;
    qq      dispatcher.queues;
    limited text[];
    caps    integer[];
    rates   float8[];
    bursts  integer[];
    seen    bigint[];
    kept    bigint[];
BEGIN
    SELECT * INTO qq FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND OR cardinality(ids) = 0 OR NOT dispatcher.keys_limited(qq) THEN
        RETURN ids;
    END IF;
    -- the limited keys among the jobs, with their limits, once per key
    SELECT array_agg(d.k ORDER BY d.k), array_agg(l.max_inflight ORDER BY d.k),
           array_agg(l.rate_per_s ORDER BY d.k), array_agg(l.burst ORDER BY d.k)
      INTO limited, caps, rates, bursts
      FROM (SELECT DISTINCT k FROM unnest(keys) k WHERE k IS NOT NULL) d
     CROSS JOIN LATERAL dispatcher.key_limits_of(qq, d.k) l
     WHERE l.max_inflight IS NOT NULL OR l.rate_per_s IS NOT NULL;
    IF limited IS NULL THEN
        RETURN ids;
    END IF;
    FOR pass_ IN 1..2 LOOP
        -- the keys' rows, locked in key order; their counts as of the lock
        SELECT array_agg(k.running_seen ORDER BY k.key) INTO seen FROM (
            SELECT k.key, k.running_seen FROM dispatcher.key_state k
             WHERE k.queue = q AND k.key = ANY (limited)
             ORDER BY k.key FOR UPDATE) k;
        EXIT WHEN coalesce(cardinality(seen), 0) = cardinality(limited)
              AND array_position(seen, NULL) IS NULL;
        IF coalesce(cardinality(seen), 0) < cardinality(limited) THEN
            -- a key's first claim makes its row (its count not known yet)
            INSERT INTO dispatcher.key_state (queue, key, tokens)
            SELECT q, x.key, coalesce(x.burst, 0) FROM unnest(limited, bursts) AS x(key, burst)
                ON CONFLICT DO NOTHING;
            CONTINUE;
        END IF;
        -- counts not known: the running jobs of those keys, counted once (jobs_running_queue)
        -- (plus the key's ends counted so far, read in the same snapshot: an end that
        -- commits later was counted running here and is subtracted then)
        UPDATE dispatcher.key_state k SET running_seen = coalesce(c.n, 0) + coalesce(d.n, 0)
          FROM unnest(limited, seen) AS x(key, n)
          LEFT JOIN (SELECT s.concurrency_key AS key, count(*) AS n
                       FROM dispatcher.job_state s
                      WHERE s.queue = q AND s.state = 'running'
                        AND s.concurrency_key = ANY (limited)
                      GROUP BY s.concurrency_key) c ON c.key = x.key
          LEFT JOIN dispatcher.key_done d ON d.queue = q AND d.key = x.key
         WHERE x.n IS NULL AND k.queue = q AND k.key = x.key;
    END LOOP;
    -- one statement: each key's room (its bucket's level; its cap less its running jobs), the
    -- jobs kept (by rank within their key), the tokens taken from the keys that start some
    WITH room AS (
        SELECT x.key, x.rate, lv.level,
               least(coalesce(floor(lv.level)::bigint, big),
                     coalesce(x.cap - (k.running_seen - coalesce(d.n, 0)), big)) AS n
          FROM unnest(limited, caps, rates, bursts) AS x(key, cap, rate, burst)
          JOIN dispatcher.key_state k ON k.queue = q AND k.key = x.key
          LEFT JOIN dispatcher.key_done d ON d.queue = q AND d.key = x.key
         CROSS JOIN LATERAL (
               SELECT least(x.burst, k.tokens + extract(epoch FROM clock_timestamp()
                                                        - k.tokens_at) * x.rate) AS level) lv
    ), ranked AS (
        -- (a limited key without its row, were one to vanish, starts nothing)
        SELECT u.id, u.pos, CASE WHEN u.k = ANY (limited) THEN u.k END AS key,
               coalesce(r.n, 0) AS n,
               row_number() OVER (PARTITION BY u.k ORDER BY u.pos) AS rank
          FROM unnest(ids, keys) WITH ORDINALITY AS u(id, k, pos)
          LEFT JOIN room r ON r.key = u.k
    ), taken AS (
        UPDATE dispatcher.key_state k
           SET tokens = r.level - t.n, tokens_at = clock_timestamp()
          FROM (SELECT key, count(*) AS n FROM ranked
                 WHERE key IS NOT NULL AND rank <= n GROUP BY key) t
          JOIN room r ON r.key = t.key
         WHERE k.queue = q AND k.key = t.key AND r.rate IS NOT NULL
    )
    SELECT coalesce(array_agg(id ORDER BY pos), '{}') INTO kept
      FROM ranked WHERE key IS NULL OR rank <= n;
    RETURN kept;
END
$$;

-- How soon a claim should look again for jobs its keys held back: NULL when the pick found
-- no key at its limit (keys_at_limit said so in this transaction), else a short poll (a freed
-- key slot wakes nobody).
CREATE OR REPLACE FUNCTION dispatcher.key_wait_s() RETURNS float8
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN current_setting('dispatcher.keys_full', true) = 'true' THEN 0.05 END
$$;
