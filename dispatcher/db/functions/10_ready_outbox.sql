-- Whether a job made ready gets an outbox row: only while a relay transport reads them
-- (intake_settings.ready_outbox, kept in step with the daemon's transport at start).
CREATE OR REPLACE FUNCTION dispatcher.ready_outbox() RETURNS boolean
-- PL/pgSQL: one plan kept per session (10_due_at_past_tolerance_s.sql says why)
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce((SELECT s.ready_outbox FROM dispatcher.intake_settings s), false);
END
$$;
