-- The job list's priority and concurrency-key filters (migrations 023 and 039) are served by
-- indexes on the intents instead of the state rows. A state row is written anew at every step
-- of a job (ready, running, succeeded: each a new row version with an entry in every index of
-- job_state), an intent once at intake; priority and concurrency_key are in both tables and
-- change together (an operator's change through the jobs view, a replaced scheduled job), so
-- the list finds the same jobs. A job's concurrency key defaults to its tenant, so every job of
-- a tenant paid an entry in jobs_concurrency_key_id at each step, and every job off priority 0
-- one in jobs_priority_id: in the drain of 20,000 jobs over 10,000 tenants, 1.5-3 us of
-- PostgreSQL time per job in the claim alone (tests/bench/bench_priorities.py); now one entry
-- at intake.
--
-- Cost on upgrade: each CREATE INDEX reads the intents once and blocks writes to them (intake)
-- while it builds; both hold only the jobs that have their column set. To avoid that pause on
-- a large table, build them first with CREATE INDEX CONCURRENTLY (docs/guides/operating.md):
-- this file then finds them and builds nothing. An invalid leftover of a failed concurrent
-- build is dropped and built again.

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
           AND c.relname IN ('intents_priority_id', 'intents_concurrency_key_id')
    LOOP
        EXECUTE format('DROP INDEX dispatcher.%I', leftover);
    END LOOP;
END
$$;

CREATE INDEX IF NOT EXISTS intents_priority_id ON dispatcher.intents (priority, id)
    WHERE priority <> 0;
CREATE INDEX IF NOT EXISTS intents_concurrency_key_id ON dispatcher.intents (concurrency_key, id)
    WHERE concurrency_key IS NOT NULL;
DROP INDEX IF EXISTS dispatcher.jobs_priority_id;
DROP INDEX IF EXISTS dispatcher.jobs_concurrency_key_id;
