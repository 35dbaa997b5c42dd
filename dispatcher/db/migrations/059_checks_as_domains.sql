-- The intents' seven single-column checks that no index names move from the table to domains,
-- the columns' new types, under the same names. A table's CHECK constraints are read back from
-- their stored text and planned again by every statement that writes a row, however few its
-- rows: a third of the instructions of a one-job `dispatcher.enqueue` (docs/performance: "One
-- job per statement"). A domain's checks are read once per session (PostgreSQL's type cache)
-- and run only where a statement assigns the column, so the guard still holds for every
-- writer, the doors and an operator's SQL alike.
--
-- The change keeps the table's data and its indexes: a column's change to a domain with no
-- constraint yet is no rewrite and no scan (to a domain that had its checks already, it would
-- rewrite the table), then each check is added NOT VALID (the rows the table's check guarded
-- are not read again). A column that a partial index names (in its key or its predicate) has
-- that index built again under an exclusive lock when its type changes: measured at 10 million
-- jobs, 48 s for the eleven indexes that name the state rows' `state`, `due_at` and
-- `expires_at` or the intents' `priority` and `concurrency_key`, so those keep their table
-- checks, as does the two-column `job_state_lease_check`. The views that read the moved
-- columns, and the trigger that names one, are dropped here and created again by their files
-- in db/functions/ (20_jobs, 20_run_receipts, 30_intent_bytes), all applied again after any
-- migration.

DROP VIEW IF EXISTS dispatcher.jobs;
DROP VIEW IF EXISTS dispatcher.run_receipts;
DROP TRIGGER IF EXISTS intents_size_bytes_changed ON dispatcher.intents;

ALTER TABLE dispatcher.intents
    DROP CONSTRAINT jobs_key_check,
    DROP CONSTRAINT jobs_payload_check,
    DROP CONSTRAINT jobs_max_attempts_check,
    DROP CONSTRAINT jobs_max_retry_age_s_check,
    DROP CONSTRAINT jobs_traceparent_w3c,
    DROP CONSTRAINT intents_timeout_s_positive,
    DROP CONSTRAINT intents_replaced_by_mode;

CREATE DOMAIN dispatcher.job_key AS text;
CREATE DOMAIN dispatcher.job_payload AS jsonb;
CREATE DOMAIN dispatcher.job_max_attempts AS integer;
CREATE DOMAIN dispatcher.job_max_retry_age_s AS integer;
CREATE DOMAIN dispatcher.job_traceparent AS text;
CREATE DOMAIN dispatcher.job_timeout_s AS double precision;
CREATE DOMAIN dispatcher.job_replaced_by AS text;

ALTER TABLE dispatcher.intents
    ALTER COLUMN key TYPE dispatcher.job_key,
    ALTER COLUMN payload TYPE dispatcher.job_payload,
    ALTER COLUMN max_attempts TYPE dispatcher.job_max_attempts,
    ALTER COLUMN max_retry_age_s TYPE dispatcher.job_max_retry_age_s,
    ALTER COLUMN traceparent TYPE dispatcher.job_traceparent,
    ALTER COLUMN timeout_s TYPE dispatcher.job_timeout_s,
    ALTER COLUMN replaced_by TYPE dispatcher.job_replaced_by;

ALTER DOMAIN dispatcher.job_key
    ADD CONSTRAINT jobs_key_check CHECK (length(VALUE) BETWEEN 1 AND 255) NOT VALID;
ALTER DOMAIN dispatcher.job_payload
    ADD CONSTRAINT jobs_payload_check CHECK (jsonb_typeof(VALUE) = 'object') NOT VALID;
ALTER DOMAIN dispatcher.job_max_attempts
    ADD CONSTRAINT jobs_max_attempts_check CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN dispatcher.job_max_retry_age_s
    ADD CONSTRAINT jobs_max_retry_age_s_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN dispatcher.job_traceparent
    ADD CONSTRAINT jobs_traceparent_w3c
    CHECK (VALUE ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$') NOT VALID;
ALTER DOMAIN dispatcher.job_timeout_s
    ADD CONSTRAINT intents_timeout_s_positive
    CHECK (VALUE > 0 AND VALUE < 'infinity'::double precision) NOT VALID;
ALTER DOMAIN dispatcher.job_replaced_by
    ADD CONSTRAINT intents_replaced_by_mode CHECK (VALUE IN ('replace', 'keep_due')) NOT VALID;

-- a column whose type changes loses its statistics; the key's lookups and prefix search plan by them
ANALYZE dispatcher.intents (key);
