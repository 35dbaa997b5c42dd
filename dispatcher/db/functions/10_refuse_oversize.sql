-- The SQL door's refusal of a batch holding an item over limits.max_payload_bytes, or one long
-- enough to hold a number the daemon cannot read (dispatcher.long_integer, looked for only
-- then): the first such item named, nothing written. Each item's text is measured once.
-- dispatcher.enqueue_many_internal calls it only when the sizes it wrote call for it (its
-- `refuse_over`), or before it refuses the call for another reason, so that this refusal
-- comes first, as it did when the door checked every item before the insert.
CREATE OR REPLACE FUNCTION dispatcher.refuse_oversize(keys text[], payloads jsonb[],
                                                      targets jsonb[], max_bytes bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bad_item   bigint;
    bad_key    text;
    bad_size   bigint;
    bad_digits text;
BEGIN
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
END
$$;
