-- The doors' refusal: SQLSTATE 22008 (datetime field overflow), the value, the item of a batch,
-- and what to send instead.
CREATE OR REPLACE FUNCTION dispatcher.refuse_due_at(due timestamptz, item bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    bounds tstzrange := dispatcher.due_at_range();
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('dispatcher.enqueue: due_at %s%s is out of range', due,
                         CASE WHEN item IS NULL THEN '' ELSE format(' (item %s)', item) END),
        ERRCODE = '22008',
        HINT = format('a due time is finite, from %s through %s; pass NULL to run now',
                      to_char(lower(bounds) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                      to_char(upper(bounds) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'));
END
$$;
