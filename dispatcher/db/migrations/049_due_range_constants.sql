-- The state table's due-time checks (migrations 006 and 030) compare against the range as a
-- constant instead of calling dispatcher.due_at_range(). That function is a SQL function
-- whose body parses two timestamps (a stable operation), so the planner cannot inline it; it
-- folds the call by running it, which plans its body anew: once per check, per statement that
-- writes a state row. A job's intake, claim and end each write one, with two checks each:
-- about 28,000 runs for 5,000 jobs in the peer benchmark's W3 (one job per statement), 7 us
-- of PostgreSQL time each (pg_stat_statements). The literal range is parsed once, here.
-- The bounds are those of due_at_range(), which the doors and the claim still call inside
-- their kept plans (folded once per plan).
-- Both checks are added NOT VALID: every row already met the same checks (the due-time one
-- was NOT VALID before too, see migration 006), and validating would read the whole table
-- under this migration's lock.
ALTER TABLE dispatcher.job_state
    DROP CONSTRAINT job_state_due_at_in_range,
    ADD CONSTRAINT job_state_due_at_in_range
        CHECK (due_at <@ '[2000-01-01 00:00:00+00,9999-12-31 23:59:59+00]'::tstzrange) NOT VALID,
    DROP CONSTRAINT job_state_expires_at_range,
    ADD CONSTRAINT job_state_expires_at_range
        CHECK (expires_at <@ '[2000-01-01 00:00:00+00,9999-12-31 23:59:59+00]'::tstzrange)
        NOT VALID;
