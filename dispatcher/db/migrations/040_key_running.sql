-- Per-key limits that do not bind cost a drain little (issue 22, "Done when"): each limited
-- key's running jobs are its starts (key_state.running_seen) less its ends (key_done.n), so a
-- claim reads two rows per key it starts instead of counting running jobs by index (keyed
-- drains ran at 68-76 % of the plain drain with the count).
--
-- Both are kept by one statement-level trigger on dispatcher.job_state (function file
-- 30_key_running.sql): whatever path moves a job into or out of `running` (a claim on either
-- transport, completion, retry, dead letter, cancel, snooze, the rescue of a dead daemon's or
-- an expired lease's jobs, bulk actions, a deleted row), the same statement counts it.
-- running_seen NULL means not known: a key's first claim, or a change of its limits (its
-- queue's key_* settings, its override), leaves it NULL, and the next claim of that key counts
-- the running jobs once, under the key's row lock (key_take), from then on adding starts.
ALTER TABLE dispatcher.key_state ADD COLUMN running_seen bigint;

-- The jobs of each limited key that left `running`, counted apart from key_state: a batch of
-- completions never waits for the key rows that claims hold locked (measured: with both counts
-- in key_state the trigger spent 252 ms of a 0.66 s keyed drain, mostly waiting for claims).
-- A key's running jobs are running_seen - n: a claim reads n without a lock (a completion it
-- does not see yet only leaves it less room).
CREATE TABLE dispatcher.key_done (
    queue text NOT NULL,
    key   text NOT NULL,
    n     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, key)
) WITH (fillfactor = 50);

-- Nothing counts running jobs per key any more: claims read running_seen, the first count of a
-- key scans its queue's running jobs (jobs_running_queue). One index fewer to write per start.
DROP INDEX dispatcher.jobs_running_key;
