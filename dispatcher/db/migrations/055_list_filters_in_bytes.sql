-- The job list's handler and tenant filters (migration 009) read indexes that compare bytes
-- (COLLATE "C") instead of the database's collation. Each intake writes an entry into them (the
-- tenant's only for a job with a tenant), and in a database with a linguistic collation
-- (en_US.UTF-8, C.UTF-8 before PostgreSQL 17) each comparison of the entry's descent went
-- through the C library's strcoll: 4 % of a batch of 10,000 no-op jobs (`enqueue_many`,
-- 129 -> 124 ms, medians of 5 alternating rounds; docs/performance). The filters are
-- equalities, which mean the same in any deterministic collation, and the list orders by id,
-- so nothing a user sees changes; list_jobs compares with COLLATE "C" to use them (the tenant
-- index's predicate in the same collation, or the planner could not prove a filter implies
-- it). A database created with the C locale (the embedded one) gains nothing and loses nothing.
--
-- Cost on upgrade: each CREATE INDEX reads the intents once and blocks writes to them (intake)
-- while it builds (about 20 s for 10 million rows on 2 cores). To avoid that pause on a large
-- table, build them first with CREATE INDEX CONCURRENTLY (docs/guides/operating.md): this file
-- then finds them and builds nothing. An invalid leftover of a failed concurrent build is
-- dropped and built again.

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
           AND c.relname IN ('intents_handler_id', 'intents_tenant_id')
    LOOP
        EXECUTE format('DROP INDEX dispatcher.%I', leftover);
    END LOOP;
END
$$;

CREATE INDEX IF NOT EXISTS intents_handler_id ON dispatcher.intents (handler COLLATE "C", id);
CREATE INDEX IF NOT EXISTS intents_tenant_id ON dispatcher.intents (tenant COLLATE "C", id)
    WHERE tenant COLLATE "C" <> '';
DROP INDEX IF EXISTS dispatcher.jobs_handler_id;
DROP INDEX IF EXISTS dispatcher.jobs_tenant_id;
