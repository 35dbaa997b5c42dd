-- Per-job contracts (issue 23, points 6 and 7; docs/guides/callbacks.md, docs/guides/deadlines.md).
--
-- A time to live: `job_state.expires_at`, when set, is the last moment any attempt of the job
-- may start. The due-scan ends a scheduled or ready job past it `dead` with reason `expired`
-- (an index of the few rows that have one: jobs without a TTL are not in it), and both claims
-- refuse to start one that expired between the scan and the claim (db/queries.sql claim_ready,
-- db/relay.sql claim_delivered). On the state row, not the intent, so neither the scan nor the
-- claim reads the intent for it.
--
-- A deadline per job: `intents.timeout_s`, at most the handler's own (`handlers.max_timeout_s`,
-- written from the configuration at start, so the SQL door can refuse more than it allows).
--
-- Callbacks: `intents.on_success` / `on_failure` name a target (the same object as an http job's
-- target) pushed once when the job ends succeeded / dead. `job_state.has_callback` lets the
-- trigger that enqueues the push (30_job_callback.sql) skip every other job without reading its
-- intent. Adding a NOT NULL column with a constant default rewrites nothing.

ALTER TABLE dispatcher.job_state
    ADD COLUMN expires_at timestamptz
        CONSTRAINT job_state_expires_at_range CHECK (expires_at <@ dispatcher.due_at_range()),
    ADD COLUMN has_callback boolean NOT NULL DEFAULT false;

CREATE INDEX job_state_expiring ON dispatcher.job_state (expires_at)
 WHERE expires_at IS NOT NULL AND state IN ('scheduled', 'ready');

ALTER TABLE dispatcher.intents
    ADD COLUMN timeout_s double precision
        CONSTRAINT intents_timeout_s_positive CHECK (timeout_s > 0 AND timeout_s < 'infinity'),
    ADD COLUMN on_success jsonb,
    ADD COLUMN on_failure jsonb,
    -- the job whose ending this callback reports (NULL: not a callback); a callback never
    -- calls back in turn, so a broken callback target cannot loop
    ADD COLUMN callback_of bigint;

ALTER TABLE dispatcher.handlers ADD COLUMN max_timeout_s double precision;

-- the SQL door takes the contract (db/functions/10_enqueue.sql): its signature grows
DROP FUNCTION IF EXISTS dispatcher.enqueue(text, text, jsonb, timestamptz, text, text, jsonb,
                                           integer, integer, integer, text);
