-- A successful attempt's history is kept on its job's state row instead of a row of its own in
-- dispatcher.attempts. A success is always a job's last attempt (succeeded is final: no retry,
-- rescue or replacement moves a job out of it), and its completion already rewrites the state
-- row with the attempt's start and end; the owner, HTTP status, latency and response excerpt
-- go in the same row version. The history row was 17.7 % of a drain's completion (89,512 ->
-- 73,704 PostgreSQL instructions a job, tests/bench/bench_instructions.py, docs/performance):
-- a heap row, its primary key entry and a sequence number, for every job that ever succeeded.
--
-- Readers see one history: the view dispatcher.attempt_history (db/functions/
-- 20_attempt_history.sql) puts the kept success after the attempts rows of its job. Successes
-- recorded before this migration keep their attempts row and leave these columns empty, so
-- each attempt is shown once.
--
-- Columns without a default: adding them rewrites nothing (a catalogue change only).
ALTER TABLE dispatcher.job_state
    ADD COLUMN succeeded_by text,
    ADD COLUMN success_http_status integer,
    ADD COLUMN success_latency_s double precision,
    ADD COLUMN success_excerpt text;
