
CREATE OR REPLACE FUNCTION dispatcher.enqueue_many(
    keys            text[],
    handlers        text[],
    payloads        jsonb[],
    due_ats         timestamptz[] DEFAULT NULL,
    queues          text[] DEFAULT NULL,
    tenants         text[] DEFAULT NULL,
    targets         jsonb[] DEFAULT NULL,
    max_attempts    integer[] DEFAULT NULL,
    max_retry_age_s integer[] DEFAULT NULL,
    run_keys        text[] DEFAULT NULL,
    priorities      integer[] DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL
) RETURNS SETOF dispatcher.enqueue_result
LANGUAGE plpgsql
AS $$
DECLARE
    tolerance_s float8 := dispatcher.due_at_past_tolerance_s();
    bad_item    bigint;
    bad_due     timestamptz;
BEGIN
    -- times out of range are left to the internal door's own refusal (22008)
    SELECT u.o, u.d INTO bad_item, bad_due
      FROM unnest(due_ats) WITH ORDINALITY AS u(d, o)
     WHERE u.d < now() - make_interval(secs => tolerance_s)
       AND u.d <@ dispatcher.due_at_range()
     ORDER BY u.o
     LIMIT 1;
    IF bad_item IS NOT NULL THEN
        PERFORM dispatcher.refuse_past_due(bad_due, tolerance_s, bad_item);
    END IF;
    RETURN QUERY SELECT * FROM dispatcher.enqueue_many_internal(
        keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
        max_retry_age_s, run_keys, priorities, concurrency_keys);
END
$$;
