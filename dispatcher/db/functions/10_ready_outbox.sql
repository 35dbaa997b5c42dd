-- Whether a job made ready gets an outbox row: only while a relay transport reads them
-- (intake_settings.ready_outbox, kept in step with the daemon's transport at start).
CREATE OR REPLACE FUNCTION dispatcher.ready_outbox() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT s.ready_outbox FROM dispatcher.intake_settings s), false)
$$;
