-- The job list's key-prefix search reads the matching ids from the prefix index alone (an
-- index-only scan: the index carries the id) and, when they are few enough
-- (dispatcher.db.job_reads.PREFIX_SCAN_IDS), sorts them and reads the newest page's jobs by id.
-- Migration 039's index gave only the key: the planner walked the primary key backwards
-- instead, expecting matches spread over all ids, and a prefix whose many matches are all old
-- read most of the table (15.2 s p95 for 111,111 old keys of 10 million jobs; list_jobs).
--
-- This index replaces jobs_key_prefix (same key, same LIKE operator class, plus the id).
-- Cost on upgrade: CREATE INDEX reads every job once and blocks writes to dispatcher.intents
-- (not reads) while it builds (16 s at 10 million jobs). To avoid that pause, build it first
-- with CREATE INDEX CONCURRENTLY (docs/operating): this file then finds it and builds nothing.
-- An invalid leftover of a failed concurrent build is dropped and built again.

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_index i
                 JOIN pg_class c ON c.oid = i.indexrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'dispatcher' AND c.relname = 'jobs_key_prefix_id'
                  AND NOT i.indisvalid) THEN
        DROP INDEX dispatcher.jobs_key_prefix_id;
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS jobs_key_prefix_id ON dispatcher.intents (key text_pattern_ops)
    INCLUDE (id);
DROP INDEX IF EXISTS dispatcher.jobs_key_prefix;
