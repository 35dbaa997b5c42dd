-- The doors' refusal of a due time long past: SQLSTATE 22023 (invalid parameter value), like
-- every other bad argument, with the value, the item of a batch and what to send instead.
CREATE OR REPLACE FUNCTION dispatcher.refuse_past_due(due timestamptz, tolerance_s float8,
                                           item bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('dispatcher.enqueue: due_at %s%s is more than %s s in the past',
                         to_char(due AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                         CASE WHEN item IS NULL THEN '' ELSE format(' (item %s)', item) END,
                         tolerance_s),
        ERRCODE = '22023',
        HINT = 'pass NULL to run now, or a time to come (the daemon''s due_at_past_tolerance_s '
               'sets how far past is still accepted; see dispatcher.intake_settings)';
END
$$;
