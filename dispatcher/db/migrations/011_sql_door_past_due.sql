-- The SQL door refuses due times long past, as the HTTP API does; a job's retry budget starts
-- when it is accepted or due, whichever is later.
--
-- 1. The tolerance. HTTP intake refuses a due_at more than `due_at_past_tolerance_s` (300 s)
--    before now: a time that far past is a mistake (a wrong year, a stale message), and "run
--    now" is said by omitting it. The database cannot read the daemon's configuration, so the
--    daemon writes the setting into dispatcher.intake_settings at every start, beside the queue
--    registry (JobRepository.sync_registry); until a daemon has started, the default holds.
--    Daemons sharing a database should share the setting: the last one started wins.
-- 2. The doors. dispatcher.enqueue and dispatcher.enqueue_many, what applications call, refuse
--    such a time with SQLSTATE 22023, naming the value (and the item of a batch), the tolerance
--    and the fix. The daemon's own callers use dispatcher.enqueue_many_internal, which checks
--    everything else alike: HTTP intake checks the tolerance itself, per item, since one bad
--    item of a batch must not reject the others (a 422 for that item); cron units, catch-up of
--    past periods included, carry no due time (due when created) and need no exception.
-- 3. The budget. budget_started_at was the due time, so a job accepted with a due time long
--    past (the SQL door let it in) was beyond `max_retry_age_s` at its first failure and died
--    with dead_reason 'max_retry_age' after one attempt (and a reschedule to a past time did
--    the same). It is now greatest(due time, now()). Waiting or running jobs whose budget started
--    before they were accepted get their acceptance time (one pass over the table on upgrade;
--    only such rows are written).

CREATE TABLE dispatcher.intake_settings (
    singleton               boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    due_at_past_tolerance_s float8 NOT NULL DEFAULT 300
        CHECK (due_at_past_tolerance_s BETWEEN 0 AND 315360000),  -- config.MAX_DURATION_S
    updated_at              timestamptz NOT NULL DEFAULT now()
);
INSERT INTO dispatcher.intake_settings DEFAULT VALUES;

-- dispatcher.due_at_past_tolerance_s and dispatcher.refuse_past_due were created here (bodies:
-- db/functions/).

UPDATE dispatcher.jobs
   SET budget_started_at = created_at
 WHERE budget_started_at < created_at AND state IN ('scheduled', 'ready', 'running');

-- Created or changed here (bodies: db/functions/): dispatcher.enqueue_many_internal, the
-- daemon's door (enqueue_many as in 006, the budget starting at greatest(due, now())); and the
-- SQL doors dispatcher.enqueue_many and dispatcher.enqueue, which refuse a due time long past
-- first, then do the same.
