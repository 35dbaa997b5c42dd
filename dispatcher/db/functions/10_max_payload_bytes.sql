-- The largest payload and target one job may carry, in bytes of JSON text (the daemon's
-- limits.max_payload_bytes, written into intake_settings at start: migration 029).
CREATE OR REPLACE FUNCTION dispatcher.max_payload_bytes() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT s.max_payload_bytes FROM dispatcher.intake_settings s), 262144)
$$;
