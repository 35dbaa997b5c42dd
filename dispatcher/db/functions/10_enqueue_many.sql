-- The SQL door for batches: refuses the call when an item is due long past or carries a
-- payload and target over limits.max_payload_bytes (the daemon's door checks both per item
-- before calling), then does what the daemon's door does.
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
    bad_key     text;
    bad_size    bigint;
    bad_digits  text;
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
    -- each item's text measured once: over the limit, or long enough to hold a number the
    -- daemon cannot read (dispatcher.long_integer, looked for only then)
    SELECT u.o, u.k, u.size, u.digits INTO bad_item, bad_key, bad_size, bad_digits
      FROM (SELECT u.o, u.k, s.size,
                   CASE WHEN s.size > 4300 AND s.size <= max_bytes
                        THEN dispatcher.long_integer(u.p, u.tg) END AS digits
              FROM unnest(keys, payloads, targets) WITH ORDINALITY AS u(k, p, tg, o)
             CROSS JOIN LATERAL (SELECT dispatcher.stored_bytes(u.p, u.tg) AS size) s) u
     WHERE u.size > max_bytes OR u.digits IS NOT NULL
     ORDER BY u.o
     LIMIT 1;
    IF bad_digits IS NOT NULL THEN
        PERFORM dispatcher.refuse_long_integer(bad_key, bad_digits, bad_item);
    ELSIF bad_item IS NOT NULL THEN
        PERFORM dispatcher.refuse_payload(bad_key, bad_size, max_bytes, bad_item);
    END IF;
    IF num_nonnulls(on_keys, debounce_max_s, timeout_s, expires_ats, on_success,
                    on_failure) > 0 THEN
        RETURN QUERY SELECT * FROM dispatcher.enqueue_many_contracts(
            keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
            max_retry_age_s, run_keys, priorities, concurrency_keys, on_keys, debounce_max_s,
            timeout_s, expires_ats, on_success, on_failure);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM dispatcher.enqueue_many_internal(
        keys, handlers, payloads, due_ats, queues, tenants, targets, max_attempts,
        max_retry_age_s, run_keys, priorities, concurrency_keys);
END
$$;
