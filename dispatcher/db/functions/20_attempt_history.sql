-- A job's attempt history, whole: the rows of dispatcher.attempts and, since migration 062, the
-- successes kept on state rows.
-- A success is its job's last attempt, so it sorts after every history row of the job: its
-- `id` is the greatest an attempts row could be given before the sequence ran for 31 years at
-- a billion rows a second (10^18 - 1, which also fits the API's 18-digit cursor). Read it by
-- job (`WHERE job_id = ...`): each branch then reads by index.
CREATE OR REPLACE VIEW dispatcher.attempt_history AS
SELECT a.id, a.job_id, a.attempt, a.owner, a.started_at, a.finished_at, a.outcome, a.reason,
       a.http_status, a.latency_s, a.excerpt
  FROM dispatcher.attempts a
 UNION ALL
SELECT 999999999999999999::bigint, s.id, s.attempt, s.succeeded_by, s.started_at,
       s.finished_at, 'succeeded', NULL::text, s.success_http_status, s.success_latency_s,
       s.success_excerpt
  FROM dispatcher.job_state s
 WHERE s.succeeded_by IS NOT NULL;
