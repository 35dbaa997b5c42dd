-- The largest payload and target one job may carry, in bytes of JSON text (the daemon's
-- limits.max_payload_bytes, written into intake_settings at start: migration 029).
CREATE OR REPLACE FUNCTION dispatcher.max_payload_bytes() RETURNS bigint
-- PL/pgSQL: one plan kept per session (10_due_at_past_tolerance_s.sql says why)
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce((SELECT s.max_payload_bytes FROM dispatcher.intake_settings s), 262144);
END
$$;
