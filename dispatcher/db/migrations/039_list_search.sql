-- The job list's searches (GET /v1/jobs, the console, `dispatcher jobs list` and `jobs bulk`):
-- a key prefix, text in the last error, and a concurrency key. Each is served by an index, so a
-- page (newest first by id) costs the matches it reads, not the table's size
-- (tests/db/test_search_plans.py plans each one on a table with the statistics of a large one).
--
-- key_prefix: `key LIKE 'prefix%'` (the prefix's % _ and \ escaped) reaches a btree only through
-- an operator class that compares bytes; the unique index on key follows the database's
-- collation, which under most locales serves no LIKE, so a second index in text_pattern_ops.
--
-- error: `last_error ILIKE '%text%'` needs a trigram index (pg_trgm, shipped with PostgreSQL's
-- contrib and trusted since PostgreSQL 13: a database owner may create it). Where the extension
-- cannot be created, nothing fails: this file builds no such index and the list searches the
-- last errors of the newest jobs only (dispatcher.db.job_reads.ERROR_SCAN_ROWS), as its answer
-- and the docs say. Only jobs that have a last error have an entry.
--
-- concurrency_key: jobs of one key with the id; only jobs that have a key have an entry.
--
-- Cost on upgrade: each CREATE INDEX reads its table once and blocks writes to it (not reads)
-- while it builds (the key index reads every job; the other two hold only the jobs that have
-- their column). To avoid that pause, build the same indexes first with CREATE INDEX
-- CONCURRENTLY: this file then finds them and builds nothing. An invalid leftover of a failed
-- concurrent build is dropped and built again. Each index is one more entry per row version
-- written where its column is set (the last-error index only on a failure).

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
           AND c.relname IN ('jobs_key_prefix', 'jobs_concurrency_key_id', 'jobs_last_error_trgm')
    LOOP
        EXECUTE format('DROP INDEX dispatcher.%I', leftover);
    END LOOP;
END
$$;

CREATE INDEX IF NOT EXISTS jobs_key_prefix ON dispatcher.intents (key text_pattern_ops);
CREATE INDEX IF NOT EXISTS jobs_concurrency_key_id ON dispatcher.job_state (concurrency_key, id)
    WHERE concurrency_key IS NOT NULL;

DO $$
DECLARE
    trgm_schema name;
BEGIN
    SELECT e.extnamespace::regnamespace::name INTO trgm_schema
      FROM pg_extension e WHERE e.extname = 'pg_trgm';
    IF trgm_schema IS NULL THEN
        IF NOT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_trgm') THEN
            RAISE NOTICE 'pg_trgm is not installed: the last-error search scans the newest jobs';
            RETURN;
        END IF;
        BEGIN
            CREATE EXTENSION pg_trgm;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'pg_trgm may not be created by this role: the last-error search scans '
                         'the newest jobs (a superuser may CREATE EXTENSION pg_trgm, then migrate)';
            RETURN;
        END;
        SELECT e.extnamespace::regnamespace::name INTO trgm_schema
          FROM pg_extension e WHERE e.extname = 'pg_trgm';
    END IF;
    EXECUTE format(
        'CREATE INDEX IF NOT EXISTS jobs_last_error_trgm ON dispatcher.job_state '
        'USING gin (last_error %I.gin_trgm_ops) WHERE last_error IS NOT NULL', trgm_schema);
END
$$;
