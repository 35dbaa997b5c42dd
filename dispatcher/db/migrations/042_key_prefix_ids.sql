-- Two indexes for the job list's worst searches at 10 million jobs (list_jobs; measured by
-- tests/bench/bench_console.py, docs/performance):
--
-- jobs_key_prefix_id: a key-prefix search reads the matching ids from this index alone (an
-- index-only scan: the index carries the id) and, when they are few enough
-- (dispatcher.db.job_reads.PREFIX_SCAN_IDS), sorts them and reads the newest page's jobs by id.
-- Migration 039's index held only the key: the planner walked the primary key backwards
-- instead, expecting the matches spread over all ids, and a prefix whose many matches were all
-- old read most of the table (15.2 s p95 for 111,111 old keys). It replaces jobs_key_prefix
-- (same key, same LIKE operator class, plus the id).
--
-- jobs_dead_reason_queue_id: a dead reason with a queue, newest first within the pair. With
-- jobs_dead_reason_id alone (migration 031) the pair read every job of the reason and checked
-- its queue, and a pair with no jobs read the reason's whole range (849 ms for 100,000).
-- Only dead jobs (which have a reason) have an entry.
--
-- Cost on upgrade: each CREATE INDEX reads its table once and blocks writes to it (not reads)
-- while it builds (the key index reads every job: 16 s at 10 million; the reason index reads
-- job_state but holds only the dead jobs: 3 s). To avoid that pause, build them first with
-- CREATE INDEX CONCURRENTLY (docs/guides/operating.md): this file then finds them and builds
-- nothing. An invalid leftover of a failed concurrent build is dropped and built again.

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
           AND c.relname IN ('jobs_key_prefix_id', 'jobs_dead_reason_queue_id')
    LOOP
        EXECUTE format('DROP INDEX dispatcher.%I', leftover);
    END LOOP;
END
$$;

CREATE INDEX IF NOT EXISTS jobs_key_prefix_id ON dispatcher.intents (key text_pattern_ops)
    INCLUDE (id);
DROP INDEX IF EXISTS dispatcher.jobs_key_prefix;
CREATE INDEX IF NOT EXISTS jobs_dead_reason_queue_id ON dispatcher.job_state
    (dead_reason, queue, id) WHERE dead_reason IS NOT NULL;
