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

-- The trigger becomes a BEFORE trigger of another function (functions/30_limits_changed.sql;
-- a database made before the function files has the old ones).
DROP TRIGGER IF EXISTS queues_limits_changed ON dispatcher.queues;
DROP FUNCTION IF EXISTS dispatcher.drop_claim_permits();

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
-- gives the cost). Joining a group drops the queue's parked permits (queues_limits_changed).
-- Bodies: functions/10_group_grant.sql, 10_claim_grant.sql, 10_claim_settle.sql.
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
-- Bodies: functions/10_key_limits.sql, 10_claim_pick.sql.
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
