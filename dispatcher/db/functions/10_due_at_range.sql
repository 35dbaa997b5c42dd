-- The due times a job may hold (migration 006): from 2000-01-01T00:00:00Z through
-- 9999-12-31T23:59:59Z, both included (dispatcher.cron.expression's EARLIEST_INSTANT and
-- LATEST_INSTANT). The doors, the claims and the relay compare against it.
--
-- PL/pgSQL, not SQL, for what a call costs where it is folded: PostgreSQL folds an immutable
-- call with constant arguments by running it when it plans the statement. A SQL function is
-- planned anew each time it runs that way (5.5 us per fold, 10,000 folds timed), and the
-- statements the daemon plans per call (the relay's claim_delivered names it three times)
-- paid that on every call; a PL/pgSQL function keeps its compiled body per session (no
-- measurable cost over a literal range). The state table's checks hold the range as a
-- constant (migration 049).
CREATE OR REPLACE FUNCTION dispatcher.due_at_range() RETURNS tstzrange
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN tstzrange(to_timestamp(946684800), to_timestamp(253402300799), '[]');
END
$$;
