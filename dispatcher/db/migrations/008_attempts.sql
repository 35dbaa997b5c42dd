-- The attempt history: one row per attempt that ended, whatever ended it.
--
-- Rows are written by the statements that already record an attempt's end (complete_succeeded,
-- record_failure, rescue_expired_leases, release_leases), as one more CTE: no round trip of its
-- own. Outcomes:
--   succeeded      the effect succeeded; the job is `succeeded`
--   retried        the attempt failed; the job is `scheduled` for another attempt
--   dead           the attempt failed and ended the job (`reason` is the job's dead_reason)
--   cancelled      the attempt failed while a cancel was requested; the job is `cancelled`
--   lease_expired  its worker stopped heartbeating (crash, partition); the rescuer took the job
--   released       a graceful drain handed the unfinished attempt back; it does not count, so
--                  the next attempt carries the same number
-- `reason` says why a failed attempt failed (timeout, transient, rate_limited, error, or the
-- code of a permanent failure such as http_4xx); for `dead` it is the job's dead_reason.
-- `excerpt` is the error, or for an http success the start of the response body, cut to 500
-- characters.
--
-- There is no foreign key to jobs: its check would cost one lookup and row lock per inserted
-- row on the hottest statement. The prune statement deletes a job's attempts together with
-- the job instead (prune_terminal), by the same index probes.
CREATE TABLE dispatcher.attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    job_id      bigint NOT NULL,
    attempt     integer NOT NULL,
    owner       text NOT NULL,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN
                    ('succeeded', 'retried', 'dead', 'cancelled', 'lease_expired', 'released')),
    reason      text,
    http_status integer,
    latency_s   double precision,
    excerpt     text,
    -- One index serves the read (a job's attempts, newest first) and the prune (by job id).
    PRIMARY KEY (job_id, id)
);
