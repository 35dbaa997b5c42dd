-- A successful attempt's history is kept on its job's state row instead of a row of its own in
-- dispatcher.attempts. A success is always a job's last attempt (succeeded is final: no retry,
-- rescue or replacement moves a job out of it), and its completion already rewrites the state
-- row with the attempt's start and end; the owner, HTTP status, latency and response excerpt
-- go in the same row version. The history row was 17.7 % of a drain's completion (89,512 ->
-- 73,704 PostgreSQL instructions a job, tests/bench/bench_instructions.py, docs/performance):
-- a heap row, its primary key entry and a sequence number, for every job that ever succeeded.
--
-- Readers see one history: the view dispatcher.attempt_history (below) puts the kept
-- success after the attempts rows of its job. Successes recorded before this migration keep
-- their attempts row and leave these columns empty, so each attempt is shown once.
--
-- Columns without a default: adding them rewrites nothing (a catalogue change only).
ALTER TABLE dispatcher.job_state
    ADD COLUMN succeeded_by text,
    ADD COLUMN success_http_status integer,
    ADD COLUMN success_latency_s double precision,
    ADD COLUMN success_excerpt text;

-- The history, whole: the rows of dispatcher.attempts and the successes kept on state rows.
-- A success is its job's last attempt, so it sorts after every history row of the job: its
-- `id` is the greatest an attempts row could be given before the sequence ran for 31 years at
-- a billion rows a second (10^18 - 1, which also fits the API's 18-digit cursor). Read it by
-- job (`WHERE job_id = ...`): each branch then reads by index.
CREATE VIEW dispatcher.attempt_history AS
SELECT a.id, a.job_id, a.attempt, a.owner, a.started_at, a.finished_at, a.outcome, a.reason,
       a.http_status, a.latency_s, a.excerpt
  FROM dispatcher.attempts a
 UNION ALL
SELECT 999999999999999999::bigint, s.id, s.attempt, s.succeeded_by, s.started_at,
       s.finished_at, 'succeeded', NULL::text, s.success_http_status, s.success_latency_s,
       s.success_excerpt
  FROM dispatcher.job_state s
 WHERE s.succeeded_by IS NOT NULL;
