-- Operator control of cron schedules: a schedule paused at runtime (every instance on this
-- database honours it), periods missed because of it, the `discarded` counter of a run, and
-- the index the run-finished sweep (on_finished follow-ups) probes.

-- Paused at runtime by an operator (API or CLI), as opposed to `enabled` (the configuration).
-- A paused schedule fires nothing; the periods that pass while it is paused are recorded in
-- missed_periods with reason 'paused' and stay there until an operator catches them up.
ALTER TABLE dispatcher.schedule_state
    ADD COLUMN paused    boolean NOT NULL DEFAULT false,
    ADD COLUMN paused_at timestamptz,
    ADD CONSTRAINT schedule_state_paused_at CHECK (paused = (paused_at IS NOT NULL));

ALTER TABLE dispatcher.missed_periods
    DROP CONSTRAINT missed_periods_reason_check,
    ADD CONSTRAINT missed_periods_reason_check
        CHECK (reason IN ('not_fired', 'disabled', 'coalesced', 'paused'));

-- A unit an operator discarded (dead -> discarded) is terminal like the others; the finish
-- snapshot keeps its count beside succeeded, dead and cancelled.
ALTER TABLE dispatcher.runs ADD COLUMN discarded integer;
-- dispatcher.run_receipts counts discarded units since this migration
-- (db/functions/20_run_receipts.sql).

-- The units of a run that are not terminal yet. A run is finished when this holds none of its
-- units: one index probe per unfinished run, however many of its units are done (the sweep
-- that enqueues on_finished follow-ups asks every second). Only cron units (run_key set) in a
-- waiting or running state are in it, so other jobs pay nothing for it.
CREATE INDEX jobs_run_unfinished ON dispatcher.jobs (run_key)
    WHERE run_key IS NOT NULL AND state IN ('scheduled', 'ready', 'running');
