-- The due-window list's index (jobs_due_at_id, migration 009) holds only the jobs at rest:
-- scheduled or finished, not ready or running. Every step of a job writes a new state row
-- version with an entry in every index of job_state, and a due-now job went ready (intake),
-- running (claim) and finished (completion): three entries in an index no step needs, about
-- 3 us of a bulk job's 25 us of intake (tests/bench/peers, W1) and 2 us of its claim. A job at
-- rest pays one entry per step, as before. The list reads the ready jobs of a window from the
-- claim's index (jobs_ready_claim) and the running ones from the running jobs' partial indexes,
-- sorts them, and merges them with this index's order (dispatcher/db/queries.sql,
-- list_jobs_by_due).
--
-- Cost on upgrade: CREATE INDEX reads the state rows once and blocks their writes (intake,
-- claims, completions) while it builds. To avoid that pause on a large table, build it first
-- with CREATE INDEX CONCURRENTLY (docs/guides/operating.md): this file then finds it, builds
-- nothing and drops the old index. An invalid leftover of a failed concurrent build is dropped
-- and built again.

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index i
                WHERE i.indexrelid = to_regclass('dispatcher.job_state_due_at_rest')
                  AND NOT i.indisvalid) THEN
        DROP INDEX dispatcher.job_state_due_at_rest;
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS job_state_due_at_rest ON dispatcher.job_state (due_at, id)
    WHERE state <> ALL (ARRAY['ready', 'running']);
DROP INDEX IF EXISTS dispatcher.jobs_due_at_id;
