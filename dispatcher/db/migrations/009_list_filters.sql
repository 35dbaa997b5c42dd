-- Indexes for the operator's job filters (GET /v1/jobs, `dispatcher jobs list`): tenant,
-- handler and run key each with the id, so a page (newest first by id) is a short backward walk
-- of one index whatever the table's size; due time with the id, so a due window is listed in
-- due order by a forward walk from its start. `key` has its unique index already; `state` and
-- `queue` keep theirs.
--
-- Cost on upgrade: CREATE INDEX reads the whole jobs table once per index and blocks writes to
-- it (not reads) while it builds: 40 s for all four at 10 million rows on 2 cores (README,
-- "Upgrading a large jobs table"). To avoid that pause, build the same indexes first
-- with CREATE INDEX CONCURRENTLY (the README lists the statements): this file then finds them
-- and builds nothing. A concurrent build that failed leaves an invalid index behind, which
-- would serve no query: this file drops such a leftover and builds it again.
--
-- Each extra index is one more entry written per row version (state changes already prevent
-- HOT updates), so the engine pays a little for these on every transition.

DO $$
DECLARE
    leftover text;
BEGIN
    FOR leftover IN
        SELECT c.relname
          FROM pg_index i
          JOIN pg_class c ON c.oid = i.indexrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'dispatcher' AND NOT i.indisvalid
           AND c.relname IN ('jobs_tenant_id', 'jobs_handler_id', 'jobs_run_key_id', 'jobs_due_at_id')
    LOOP
        EXECUTE format('DROP INDEX dispatcher.%I', leftover);
    END LOOP;
END
$$;

-- Jobs without a tenant are stored with '' and are not listed by tenant: no entry for them.
CREATE INDEX IF NOT EXISTS jobs_tenant_id ON dispatcher.jobs (tenant, id) WHERE tenant <> '';
CREATE INDEX IF NOT EXISTS jobs_handler_id ON dispatcher.jobs (handler, id);
-- Replaces jobs_run_key (run_key alone): same leading column for the cron statements, and a
-- run's units come out in id order for the listing.
CREATE INDEX IF NOT EXISTS jobs_run_key_id ON dispatcher.jobs (run_key, id)
    WHERE run_key IS NOT NULL;
DROP INDEX IF EXISTS dispatcher.jobs_run_key;
-- A window of due times, in (due_at, id) order: the partial jobs_scheduled_due holds waiting
-- jobs only, and an id order would have to sort the whole window (or walk the table by id).
CREATE INDEX IF NOT EXISTS jobs_due_at_id ON dispatcher.jobs (due_at, id);
