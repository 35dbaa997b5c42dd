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

-- dispatcher.claim_grant and dispatcher.claim_settle were created here; their bodies:
-- db/functions/.
