-- The SQL door's refusal of a job over limits.max_payload_bytes: SQLSTATE 54000 (program
-- limit exceeded), naming the key, the item of a batch, the size and the limit.
CREATE OR REPLACE FUNCTION dispatcher.refuse_payload(key text, size bigint, max_bytes bigint,
                                                     item bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = format('dispatcher.enqueue: the payload and target of key %s%s are %s bytes '
                         'of JSON, over limits.max_payload_bytes (%s)', quote_literal(key),
                         CASE WHEN item IS NULL THEN '' ELSE format(' (item %s)', item) END,
                         size, max_bytes),
        ERRCODE = '54000',
        HINT = 'store large data elsewhere and pass a reference (the daemon''s '
               '[limits] max_payload_bytes sets the limit; see dispatcher.intake_settings)';
END
$$;
