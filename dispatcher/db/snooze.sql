-- name: snooze_job
-- A handler asked to run again at $8 (a time; NULL: in $4 s) without spending an attempt: the
-- job goes back to 'scheduled' then (now at the earliest, by the database's clock) with its
-- attempt number given back (the next claim runs the same number again), and the attempt
-- leaves a 'snoozed' history row (reason $5, latency $7 s). It is bounded like a retry: a
-- snooze ending past the job's retry age (budget_started_at + max_retry_age_s) makes it dead
-- as 'snoozed_past_retry_age', and so does one more than $6 snoozes since its budget started
-- ('max_snoozes'), and one that would wake at or after its time to live ends it 'expired'; a
-- cancel request ends it 'cancelled'. Only the holder of the lease ($3) of
-- attempt $2 may snooze.
WITH asked AS (
    SELECT j.id, j.cancel_requested,
           greatest(now(), coalesce($8::timestamptz, now() + make_interval(secs => $4))) AS due,
           CASE WHEN j.cancel_requested THEN NULL
                WHEN (SELECT count(*) FROM dispatcher.attempts a
                       WHERE a.job_id = j.id AND a.outcome = 'snoozed'
                         AND a.finished_at >= j.budget_started_at) >= $6::integer
                THEN 'max_snoozes'
                -- no attempt starts past the job's time to live (migration 030)
                WHEN greatest(now(), coalesce($8::timestamptz, now() + make_interval(secs => $4)))
                     >= j.expires_at
                THEN 'expired'
                WHEN greatest(now(), coalesce($8::timestamptz, now() + make_interval(secs => $4)))
                     > j.budget_started_at + make_interval(secs => i.max_retry_age_s)
                THEN 'snoozed_past_retry_age'
           END AS dead_reason
      FROM dispatcher.job_state j
      JOIN dispatcher.intents i ON i.id = j.id
     WHERE j.id = $1 AND j.attempt = $2 AND j.state = 'running' AND j.lease_owner = $3
       FOR UPDATE OF j
), ended AS (
    UPDATE dispatcher.job_state j
       SET state = CASE WHEN a.cancel_requested THEN 'cancelled'
                        WHEN a.dead_reason IS NOT NULL THEN 'dead'
                        ELSE 'scheduled' END,
           dead_reason = a.dead_reason,
           attempt = CASE WHEN a.cancel_requested OR a.dead_reason IS NOT NULL THEN j.attempt
                          ELSE j.attempt - 1 END,
           due_at = CASE WHEN a.cancel_requested OR a.dead_reason IS NOT NULL THEN j.due_at
                         ELSE a.due END,
           finished_at = CASE WHEN a.cancel_requested OR a.dead_reason IS NOT NULL THEN now() END,
           last_error = CASE WHEN a.dead_reason IS NOT NULL THEN $5::text ELSE j.last_error END,
           lease_owner = NULL, lease_expires_at = NULL
      FROM asked a WHERE j.id = a.id
    RETURNING j.id, j.started_at, j.state, j.dead_reason
), history AS (
    INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at, outcome,
                                     reason, latency_s, excerpt)
    SELECT id, $2, $3, started_at, now(),
           CASE state WHEN 'scheduled' THEN 'snoozed' ELSE state END,
           coalesce(dead_reason, 'snoozed'), $7::float8, left($5::text, 500)
      FROM ended
)
SELECT state, dead_reason FROM ended;
