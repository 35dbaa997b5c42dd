-- How far in the past a due time the SQL door still accepts, in seconds: the daemon's
-- due_at_past_tolerance_s, written into dispatcher.intake_settings at every start.
CREATE OR REPLACE FUNCTION dispatcher.due_at_past_tolerance_s() RETURNS float8
-- PL/pgSQL, not SQL: a SQL function with a subquery is never inlined and, before PostgreSQL
-- 18, is planned on every call (an enqueue calls three such; their planning was 0.07 of its
-- 0.72 ms); a PL/pgSQL statement with no parameters keeps its one plan per session.
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce((SELECT s.due_at_past_tolerance_s FROM dispatcher.intake_settings s), 300);
END
$$;
