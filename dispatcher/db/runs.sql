-- Cron runs, missed periods and per-schedule accounting. Same format as queries.sql: a name,
-- then one line saying what the statement is for.

-- name: lock_schedule
-- Serialise the run-creating transactions of one schedule across every instance.
SELECT pg_advisory_xact_lock(hashtextextended('dispatcher.cron:' || $1::text, 0));

-- name: get_run
-- One run receipt with its unit counters.
SELECT * FROM dispatcher.run_receipts WHERE run_key = $1;

-- name: latest_run
-- The receipt of a schedule's latest period.
SELECT * FROM dispatcher.run_receipts WHERE schedule = $1 ORDER BY period_start DESC LIMIT 1;

-- name: insert_run
-- Record a run receipt (in the transaction that creates its units, or queues them).
INSERT INTO dispatcher.runs (run_key, schedule, period_start, via, unit_count, overlap_decision,
                             overlap_with, queued_jobs, released_at, finished_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb,
        CASE WHEN $8::jsonb IS NULL THEN now() END,
        -- a skipped run has nothing to wait for (and no follow-up); every other run is
        -- finished by finish_runs, which also enqueues its on_finished follow-up
        CASE WHEN $6 = 'skipped' THEN now() END)
ON CONFLICT DO NOTHING
RETURNING run_key;

-- name: finish_runs
-- Mark the released runs of schedule $1 whose units are all terminal as finished; return them.
-- A unit is terminal unless it is scheduled, ready or running (so `discarded` counts as well);
-- the probe is one lookup in jobs_run_unfinished per unfinished run. The caller enqueues the
-- on_finished follow-ups of the returned runs in the same transaction. `done` is MATERIALIZED:
-- inlined, the planner may join every unit of every unfinished run before it probes (118 ms
-- for one run of 100,000 units with one still running, instead of a probe).
WITH done AS MATERIALIZED (
    SELECT r.run_key
      FROM dispatcher.runs r
     WHERE r.schedule = $1 AND r.finished_at IS NULL AND r.released_at IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM dispatcher.jobs j
                        WHERE j.run_key = r.run_key
                          AND j.state IN ('scheduled', 'ready', 'running'))
), counted AS (
    SELECT d.run_key,
           count(j.id) FILTER (WHERE j.state = 'succeeded')::int AS succeeded,
           count(j.id) FILTER (WHERE j.state = 'dead')::int AS dead,
           count(j.id) FILTER (WHERE j.state = 'cancelled')::int AS cancelled,
           count(j.id) FILTER (WHERE j.state = 'discarded')::int AS discarded,
           max(j.finished_at) AS last_finished
      FROM done d LEFT JOIN dispatcher.jobs j ON j.run_key = d.run_key
     GROUP BY d.run_key
)
UPDATE dispatcher.runs r
   SET finished_at = greatest(r.released_at, coalesce(c.last_finished, r.released_at)),
       succeeded = c.succeeded, dead = c.dead, cancelled = c.cancelled, discarded = c.discarded
  FROM counted c
 WHERE r.run_key = c.run_key AND r.finished_at IS NULL
RETURNING r.run_key, r.schedule, r.period_start, r.unit_count, r.succeeded, r.dead,
          r.cancelled, r.discarded;

-- name: try_lock_schedule
-- Like lock_schedule, but give up at once (false) when another transaction holds it.
SELECT pg_try_advisory_xact_lock(hashtextextended('dispatcher.cron:' || $1::text, 0));

-- name: unfinished_before
-- The latest unfinished (or still queued) run of schedule $1 with a period before $2.
SELECT run_key FROM dispatcher.runs
 WHERE schedule = $1 AND period_start < $2 AND finished_at IS NULL
 ORDER BY period_start DESC
 LIMIT 1;

-- name: first_queued_run
-- The earliest queued run of schedule $1, the next to release.
SELECT run_key, period_start, queued_jobs FROM dispatcher.runs
 WHERE schedule = $1 AND released_at IS NULL
 ORDER BY period_start
 LIMIT 1;

-- name: release_run
-- Mark a queued run released (its units were enqueued in this transaction).
UPDATE dispatcher.runs
   SET released_at = now(), queued_jobs = NULL
 WHERE run_key = $1 AND released_at IS NULL;

-- name: count_queued_runs
-- How many runs of schedule $1 wait for an earlier run to finish.
SELECT count(*)::int FROM dispatcher.runs WHERE schedule = $1 AND released_at IS NULL;

-- name: run_periods_between
-- Period starts of schedule $1 that have a run, in ($2, $3].
SELECT period_start FROM dispatcher.runs
 WHERE schedule = $1 AND period_start > $2 AND period_start <= $3;

-- name: ensure_schedule_state
-- Start tracking schedule $1 at $3 unless already tracked; return its state before this call.
INSERT INTO dispatcher.schedule_state AS s (schedule, enabled, checked_through)
VALUES ($1, $2, $3)
ON CONFLICT (schedule) DO UPDATE SET schedule = s.schedule
RETURNING s.enabled, s.checked_through, s.tracked_since, s.paused, s.paused_at;

-- name: get_schedule_state
-- How far schedule $1 has been accounted for (no row: never started).
SELECT enabled, checked_through, tracked_since, paused, paused_at
  FROM dispatcher.schedule_state WHERE schedule = $1;

-- name: advance_schedule_state
-- Every period of schedule $1 up to $2 is accounted for; $3 is its configured enablement.
UPDATE dispatcher.schedule_state
   SET checked_through = greatest(checked_through, $2), enabled = $3, updated_at = now()
 WHERE schedule = $1;

-- name: schedule_paused
-- Whether an operator paused schedule $1 (read under its lock before a cron fire creates a run).
SELECT coalesce((SELECT paused FROM dispatcher.schedule_state WHERE schedule = $1), false);

-- name: set_schedule_paused
-- Pause ($4 true, from $3 on; kept if already paused) or resume schedule $1; tracks it from $3
-- if no instance did yet ($2 its configured enablement). Returns the state after the change.
INSERT INTO dispatcher.schedule_state AS s (schedule, enabled, checked_through, paused, paused_at)
VALUES ($1, $2, $3, $4, CASE WHEN $4 THEN $3::timestamptz END)
ON CONFLICT (schedule) DO UPDATE
   SET paused = $4,
       paused_at = CASE WHEN $4 THEN coalesce(s.paused_at, $3::timestamptz) END,
       updated_at = now()
RETURNING s.enabled, s.checked_through, s.tracked_since, s.paused, s.paused_at;

-- name: record_missed
-- Record missed periods of schedule $1 ($2 starts, $3 reasons); return the newly recorded ones.
INSERT INTO dispatcher.missed_periods (schedule, period_start, reason)
SELECT $1, m.period_start, m.reason
  FROM unnest($2::timestamptz[], $3::text[]) AS m(period_start, reason)
    ON CONFLICT DO NOTHING
RETURNING period_start, reason;

-- name: outstanding_missed
-- Missed periods of schedule $1 still without a run, newest first, at most $2; total and oldest.
SELECT m.period_start, m.reason, m.detected_at, count(*) OVER ()::int AS total,
       min(m.period_start) OVER () AS oldest
  FROM dispatcher.missed_periods m
 WHERE m.schedule = $1
   AND NOT EXISTS (SELECT 1 FROM dispatcher.runs r
                    WHERE r.schedule = m.schedule AND r.period_start = m.period_start)
 ORDER BY m.period_start DESC
 LIMIT $2;

-- name: prune_runs
-- Delete up to $2 run receipts finished more than $1 seconds ago whose units are all pruned.
WITH doomed AS (
    SELECT r.run_key FROM dispatcher.runs r
     WHERE r.finished_at < now() - make_interval(secs => $1)
       AND NOT EXISTS (SELECT 1 FROM dispatcher.jobs j WHERE j.run_key = r.run_key)
     ORDER BY r.finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
DELETE FROM dispatcher.runs r USING doomed WHERE r.run_key = doomed.run_key;

-- name: recent_runs
-- The receipts of schedule $1's latest $2 periods, newest first (the console's schedule page).
SELECT * FROM dispatcher.run_receipts WHERE schedule = $1 ORDER BY period_start DESC LIMIT $2;

-- name: runs_retrying
-- Per run among $1 (run keys): its units not finished yet that an earlier attempt failed (they
-- carry its error), through the partial index of unfinished units (the console's last runs).
SELECT run_key, count(*)::int AS retrying
  FROM dispatcher.job_state
 WHERE run_key = ANY($1::text[]) AND state IN ('scheduled', 'ready', 'running')
   AND last_error IS NOT NULL
 GROUP BY run_key;
