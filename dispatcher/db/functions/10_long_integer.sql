-- The first number of a payload or target written as an integer of more than 4,300 digits (its
-- first 20), else NULL. The daemon is written in Python, which reads no longer integer from
-- JSON text (sys.int_info.default_max_str_digits): one such job failed the decoding of every
-- job claimed with it. Call it only for a job whose text (dispatcher.stored_bytes) is over
-- 4,300 bytes: no shorter one can hold such a number, so the common job costs nothing here.
CREATE OR REPLACE FUNCTION dispatcher.long_integer(payload jsonb, target jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(n.digits, 20)
      FROM (VALUES (payload), (target)) d(doc)
     CROSS JOIN LATERAL jsonb_path_query(d.doc, 'strict $.** ? (@.type() == "number")') q(v)
     CROSS JOIN LATERAL (SELECT q.v #>> '{}' AS digits) n
     WHERE d.doc IS NOT NULL AND n.digits ~ '^-?[0-9]+$'
       AND length(ltrim(n.digits, '-')) > 4300
     LIMIT 1
$$;

-- The SQL door's refusal of such a job: SQLSTATE 22003 (numeric value out of range), naming the
-- key, the item of a batch and the number's first digits.
CREATE OR REPLACE FUNCTION dispatcher.refuse_long_integer(key text, digits text,
                                                          item bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('dispatcher.enqueue: the payload or target of key %s%s holds a number '
                         'written with more than 4300 digits (%s...), which the daemon cannot '
                         'read', quote_literal(key),
                         CASE WHEN item IS NULL THEN '' ELSE format(' (item %s)', item) END,
                         digits),
        ERRCODE = '22003',
        HINT = 'send such a value as a string';
END
$$;
