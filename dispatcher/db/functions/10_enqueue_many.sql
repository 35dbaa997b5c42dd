-- The SQL door for batches: refuses the call when an item is due long past or carries a
-- payload and target over limits.max_payload_bytes (dispatcher.refuse_oversize; the daemon's
-- door checks both per item before calling), then does what the daemon's door does.
-- Each item's contract (migration 032; NULL arrays: none): `on_keys` and `debounce_max_s`
-- (key modes), `timeout_s`, `expires_ats`, `on_success` and `on_failure`, checked as
-- dispatcher.enqueue checks them (an invalid one refuses the call, naming the item) and
-- answered as the HTTP batch answers them: a replay with another contract is a "conflict";
-- an item whose key names a job with another request and that asked to replace it answers
-- "replaced" (the scheduled job now carries it) or "not_replaced" (the job is already ready,
-- running or finished: unchanged, its state in the answer).
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
    concurrency_keys text[] DEFAULT NULL,
    on_keys         text[] DEFAULT NULL,
    debounce_max_s  integer[] DEFAULT NULL,
    timeout_s       float8[] DEFAULT NULL,
    expires_ats     timestamptz[] DEFAULT NULL,
    on_success      jsonb[] DEFAULT NULL,
    on_failure      jsonb[] DEFAULT NULL
) RETURNS SETOF dispatcher.enqueue_result
LANGUAGE plpgsql
AS $$
DECLARE
    tolerance_s float8 := dispatcher.due_at_past_tolerance_s();
    bad_item    bigint;
    bad_due     timestamptz;
    max_bytes   bigint := dispatcher.max_payload_bytes();
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
    IF num_nonnulls(on_keys, debounce_max_s, timeout_s, expires_ats, on_success,
                    on_failure) > 0 THEN
        PERFORM dispatcher.refuse_oversize(keys, payloads, targets, max_bytes);
        RETURN QUERY SELECT * FROM dispatcher.enqueue_many_contracts(
            keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
            max_retry_age_s, run_keys, priorities, concurrency_keys, on_keys, debounce_max_s,
            timeout_s, expires_ats, on_success, on_failure);
        RETURN;
    END IF;
    -- the sizes checked by the insert, which measures each item as it writes it (a second
    -- rendering of every payload here was 4 % of a batch's instructions: bench_instructions)
    RETURN QUERY SELECT * FROM dispatcher.enqueue_many_internal(
        keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
        max_retry_age_s, run_keys, priorities, concurrency_keys, refuse_over => max_bytes);
END
$$;
