-- Limits and run windows changed at run time (issue 22 points 3 and 6; docs/guides/run-windows.md).
--
-- A queue's settings come from two places: the configuration file of the daemon that started
-- last (file_settings, written at every start) and the operator's run-time overrides
-- (overrides: PATCH /v1/queues/{name}, `dispatcher queues set`). An override wins over the
-- file, also after a restart with a different file, until it is reset (`dispatcher queues
-- reset`): the file's value is kept beside it and shown. The limit columns the claims read
-- (rate_per_s, burst, max_inflight; 024's key_*) always hold the settings in force: a change
-- holds from the next claim of every daemon; NOTIFY 'limits' tells each daemon to read the rest
-- (its own token bucket and in-flight cap, the run windows) at once, and each also reads them
-- every second in case a notice was lost.
ALTER TABLE dispatcher.queues
    ADD COLUMN file_settings jsonb NOT NULL DEFAULT '{}'
        CHECK (jsonb_typeof(file_settings) = 'object'),
    ADD COLUMN overrides jsonb NOT NULL DEFAULT '{}'
        CHECK (jsonb_typeof(overrides) = 'object'),
    ADD COLUMN overrides_at timestamptz;
-- dispatcher.apply_queue_settings(q), which puts a queue's settings in force, is in
-- db/functions/10_apply_queue_settings.sql.
