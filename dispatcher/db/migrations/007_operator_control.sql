-- Operator control: paused queues, the `discarded` state, and dead-letter notifications.
--
-- Paused queues. `dispatcher.queues.paused` is read by every claim (claim_ready: one primary-key
-- probe of this table per claim batch), so a pause holds on every daemon sharing the database
-- from the moment it commits, and across restarts. Intake and the due-scan ignore it: a paused
-- queue keeps accepting and keeps moving due jobs to `ready`, so its backlog stays visible.
-- The daemon's registry sync (upsert_queue) never writes these columns.
ALTER TABLE dispatcher.queues
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN paused_at timestamptz,
    -- Dead-letter notification of the queue (from the configuration's `on_dead`): the normalized
    -- http target, and the queue the notification job runs in (NULL: the dead job's own queue).
    ADD COLUMN on_dead_target jsonb,
    ADD COLUMN on_dead_queue text,
    ADD CONSTRAINT queues_paused_at CHECK (paused = (paused_at IS NOT NULL));

-- `discarded`: an operator's verdict on a dead letter (dead -> discarded only). It is terminal,
-- and pruned with the dead retention from the time the job died (finished_at), so the record
-- stays visible as long as the dead letter would have. Every existing row satisfies the wider
-- check, so it is added without a scan (NOT VALID, like 006).
ALTER TABLE dispatcher.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE dispatcher.jobs
    ADD CONSTRAINT jobs_state_check CHECK (state IN
        ('scheduled', 'ready', 'running', 'succeeded', 'dead', 'cancelled', 'discarded')) NOT VALID;
-- The pruner's walk for discarded jobs (jobs_terminal covers the other terminal states). Empty
-- on upgrade, so it builds from one read of the table.
CREATE INDEX jobs_discarded ON dispatcher.jobs (finished_at) WHERE state = 'discarded';

-- Dead-letter notifications. When a job becomes `dead` and its queue has an `on_dead` target,
-- a signed http job reporting the death is inserted in the same transaction (so it is never
-- lost, and it has its own retries). A trigger, not a clause in each statement: a job goes dead
-- from a failed attempt (record_failure), from a lease rescue on its last attempt
-- (rescue_expired_leases), and from wherever a later change lets it; the trigger covers every
-- path at once. `dead_letter_of` marks a notification job (the id of the job it reports on):
-- such a job never notifies in turn when it dies, so a broken notification target cannot loop.
ALTER TABLE dispatcher.jobs ADD COLUMN dead_letter_of bigint;

-- dispatcher.dead_letter_notice and its trigger jobs_dead_letter_notice were created here; their
-- body: db/functions/30_dead_letter_notice.sql.
