-- The job list's dead-reason filter (GET /v1/jobs?reason=, the console's dead-letter "List"
-- link): dead and discarded jobs by reason with the id, so a page (newest first by id) is a
-- short backward walk of this index however many jobs there are. Only jobs that have a reason
-- have an entry: every other job, and so the engine's hot path, never writes to it.
--
-- Cost on upgrade: CREATE INDEX reads job_state once and blocks writes to it (not reads) while
-- it builds. To avoid the pause on a large table, build it first with
-- CREATE INDEX CONCURRENTLY and the same definition: this file then builds nothing.
CREATE INDEX IF NOT EXISTS jobs_dead_reason_id ON dispatcher.job_state (dead_reason, id)
    WHERE dead_reason IS NOT NULL;
