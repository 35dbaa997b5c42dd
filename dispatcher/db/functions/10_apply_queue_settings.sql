-- Run-time queue settings (migration 025; docs/guides/run-windows.md).
-- Put the settings in force (override, else file) into queue q's limit columns and tell every
-- daemon. A queue limit neither names keeps its column (a queue registered by an earlier
-- release); a per-key limit neither names is none.
-- The limits trigger (30_limits_changed.sql) deals with the permits parked under the old limits.
CREATE OR REPLACE FUNCTION dispatcher.apply_queue_settings(q text) RETURNS void
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
