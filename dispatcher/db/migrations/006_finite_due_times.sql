-- Due times are finite and in range, at every door and in the table.
--
-- A due time of '-infinity' made every claim of its queue fail ("cannot subtract infinite
-- timestamps"), and 'infinity' made the due-scan fail every second; years Python cannot hold
-- (before 1 or after 9999) broke every read of the row. The accepted range is
-- dispatcher.due_at_range(): from 2000-01-01T00:00:00Z through 9999-12-31T23:59:59Z, both
-- included. The last whole second Python can represent in UTC is the upper end; Python's
-- datetime.max itself is what drivers send for 'infinity'. The HTTP API, cron and this file
-- hold the same bounds (dispatcher.scheduling.cron.EARLIEST_INSTANT / LATEST_INSTANT).
--
-- Rows already stored outside the range, as the doors let them in before:
-- - not a time at all (+-infinity) and not yet finished: set to `dead` with dead_reason
--   'invalid_due_at' and the original value in last_error; their outbox rows are withdrawn.
--   The request had no meaning to honour; an operator retry runs the job now.
-- - a time, but out of range (or a finished job): moved to the nearest end of the range,
--   which keeps its meaning ("long ago": due now; "year 20000": never in practice).
-- The same for budget_started_at, which the doors set from the due time.
-- That pass reads the whole table once; the constraint is then added NOT VALID, since every
-- row already satisfies it (a later `ALTER TABLE dispatcher.jobs VALIDATE CONSTRAINT
-- jobs_due_at_in_range` can record that without blocking writers).

CREATE FUNCTION dispatcher.due_at_range() RETURNS tstzrange
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT tstzrange('2000-01-01 00:00:00+00', '9999-12-31 23:59:59+00', '[]')
$$;

WITH bad AS (
    SELECT id, state IN ('scheduled', 'ready', 'running') AND NOT isfinite(due_at) AS retire
      FROM dispatcher.jobs
     WHERE NOT (due_at <@ dispatcher.due_at_range())
        OR NOT (budget_started_at <@ dispatcher.due_at_range())
), fixed AS (
    UPDATE dispatcher.jobs j
       SET state = CASE WHEN b.retire THEN 'dead' ELSE j.state END,
           dead_reason = CASE WHEN b.retire THEN 'invalid_due_at' ELSE j.dead_reason END,
           last_error = CASE WHEN b.retire
                             THEN format('due_at %s is not a time (set to dead by migration 006; '
                                         'retry the job to run it now)', j.due_at)
                             ELSE j.last_error END,
           finished_at = CASE WHEN b.retire THEN now() ELSE j.finished_at END,
           lease_owner = CASE WHEN b.retire THEN NULL ELSE j.lease_owner END,
           lease_expires_at = CASE WHEN b.retire THEN NULL ELSE j.lease_expires_at END,
           due_at = least(greatest(j.due_at, lower(dispatcher.due_at_range())),
                          upper(dispatcher.due_at_range())),
           budget_started_at = least(greatest(j.budget_started_at,
                                              lower(dispatcher.due_at_range())),
                                     upper(dispatcher.due_at_range()))
      FROM bad b
     WHERE j.id = b.id
    RETURNING j.id, b.retire
)
DELETE FROM dispatcher.outbox o USING fixed f WHERE o.job_id = f.id AND f.retire;

ALTER TABLE dispatcher.jobs
    ADD CONSTRAINT jobs_due_at_in_range CHECK (due_at <@ dispatcher.due_at_range()) NOT VALID;

-- dispatcher.refuse_due_at (the doors' refusal: SQLSTATE 22008, the value, the item of a batch
-- and what to send instead) was created here, and enqueue_many and enqueue changed to refuse a
-- due time out of range; their bodies: db/functions/.
