-- The state row's check of its seven states moves into a domain that the table's check casts
-- to, under the same name. A table's CHECK constraints are read back from their stored text and
-- planned again by every statement that writes a row (migration 059 says why), and this one,
-- seven text values, was half of the state row's checks' text: about 45,000 PostgreSQL
-- instructions per statement that writes one state row (a one-job enqueue 918,560 -> 873,741,
-- a claim of one job 1,338,883 -> 1,294,490; a batch of 10,000 or 1,000 the same: the checks
-- run per row as before; tests/bench/bench_instructions.py, docs/performance). The cast reads
-- the domain's check from the session's type cache.
--
-- The column keeps its type: `state` is named by nine partial indexes, which a change of its
-- type would build again (migration 059). The check stays NOT VALID as it was (migration 015):
-- enforced for every write, no read of the rows stored. A violation still names
-- job_state_state_check (now the domain's: "value for domain dispatcher.job_state_value
-- violates check constraint ...") with the same SQLSTATE, 23514.
CREATE DOMAIN dispatcher.job_state_value AS text
    CONSTRAINT job_state_state_check
    CHECK (VALUE IN ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled',
                     'discarded'));

ALTER TABLE dispatcher.job_state
    DROP CONSTRAINT job_state_state_check,
    ADD CONSTRAINT job_state_state_check
        CHECK ((state::dispatcher.job_state_value) IS NOT NULL) NOT VALID;
