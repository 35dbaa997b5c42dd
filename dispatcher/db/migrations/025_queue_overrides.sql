-- Limits and run windows changed at run time (issue 22 points 3 and 6; docs/guides/run-windows.md).
--
-- A queue's settings come from two places: the configuration file of the daemon that started
-- last (file_settings, written at every start) and the operator's run-time overrides
-- (overrides: PATCH /v1/queues/{name}, `dispatcher queues set`). An override wins over the
-- file, also after a restart with a different file, until it is reset (`dispatcher queues
-- reset`): the file's value is kept beside it and shown. The limit columns that claim_grant
-- reads (rate_per_s, burst, max_inflight) always hold the settings in force, so a change holds
-- from the next claim of every daemon; NOTIFY 'limits' tells each daemon to read the rest
-- (its own token bucket and in-flight cap, the run windows) at once, and each also reads them
-- every second in case a notice was lost.
ALTER TABLE dispatcher.queues
    ADD COLUMN file_settings jsonb NOT NULL DEFAULT '{}'
        CHECK (jsonb_typeof(file_settings) = 'object'),
    ADD COLUMN overrides jsonb NOT NULL DEFAULT '{}'
        CHECK (jsonb_typeof(overrides) = 'object'),
    ADD COLUMN overrides_at timestamptz;

-- Put the settings in force (override, else file) into queue q's limit columns and tell every
-- daemon. A queue limit neither names keeps its column (a queue registered by an earlier
-- release); a per-key limit neither names is none.
-- The limits trigger (016, 024) deals with the permits parked under the old limits.
CREATE FUNCTION dispatcher.apply_queue_settings(q text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    s jsonb;  -- in force
    o jsonb;  -- the overrides alone
BEGIN
    SELECT file_settings || overrides, overrides INTO s, o FROM dispatcher.queues WHERE name = q;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE dispatcher.queues
       SET rate_per_s = CASE WHEN s ? 'rate_per_s' THEN (s->>'rate_per_s')::float8
                             ELSE rate_per_s END,
           burst = CASE WHEN s ? 'burst' THEN (s->>'burst')::integer ELSE burst END,
           max_inflight = CASE WHEN s ? 'max_inflight' THEN (s->>'max_inflight')::integer
                               ELSE max_inflight END,
           -- a lowered burst caps the tokens held, as a new file does (upsert_queue)
           tokens = least(tokens, CASE WHEN s ? 'burst' THEN (s->>'burst')::float8
                                       ELSE tokens END),
           -- every key's limits (024), none unless named; a key rate overridden alone, or
           -- given without a burst, gets one second's worth (as 024's per-key overrides do)
           key_max_inflight = (s->>'key_max_inflight')::integer,
           key_rate_per_s = (s->>'key_rate_per_s')::float8,
           key_burst = CASE WHEN o ? 'key_rate_per_s' AND NOT o ? 'key_burst'
                            THEN ceil((o->>'key_rate_per_s')::float8)::integer
                            ELSE coalesce((s->>'key_burst')::integer,
                                          ceil((s->>'key_rate_per_s')::float8)::integer)
                       END
     WHERE name = q;
    PERFORM pg_notify('dispatcher_wake', 'limits');
END
$$;
