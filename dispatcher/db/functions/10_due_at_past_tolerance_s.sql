-- How far in the past a due time the SQL door still accepts, in seconds: the daemon's
-- due_at_past_tolerance_s, written into dispatcher.intake_settings at every start.
CREATE OR REPLACE FUNCTION dispatcher.due_at_past_tolerance_s() RETURNS float8
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT s.due_at_past_tolerance_s FROM dispatcher.intake_settings s), 300)
$$;
