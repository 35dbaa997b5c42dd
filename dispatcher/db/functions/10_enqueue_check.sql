-- The per-item rules, worded: raises 22023 naming the first rule an item breaks (by message).
CREATE OR REPLACE FUNCTION dispatcher.enqueue_check(
    keys text[], handlers text[], payloads jsonb[], queues text[], targets jsonb[],
    max_attempts integer[], max_retry_age_s integer[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    bad text;
BEGIN
    SELECT min(CASE
               -- (not '^[ -~]{1,255}$': a bounded repeat makes the regex slow)
               WHEN u.k IS NULL OR length(u.k) NOT BETWEEN 1 AND 255 OR u.k ~ '[^ -~]' THEN
                   format('a key is 1 to 255 printable ASCII characters|invalid key %L', u.k)
               WHEN hd.name IS NULL THEN
                   format('use "http" or a handler configured in [handlers] (see '
                          'dispatcher.handlers)|unknown handler %L', u.h)
               WHEN qd.name IS NULL THEN
                   format('use a queue configured in [queues] (see dispatcher.queues), or '
                          'NULL for default|unknown queue %L', u.q)
               WHEN u.p IS NULL OR jsonb_typeof(u.p) <> 'object' THEN
                   'e.g. jsonb_build_object(''value'', 42)|payload must be a JSON object'
               WHEN CASE WHEN u.h = 'http'
                         THEN jsonb_typeof(u.tg -> 'url') IS DISTINCT FROM 'string'
                         ELSE u.tg IS NOT NULL END THEN
                   'pass target only with handler "http"|handler "http" needs target '
                   '{"url": ...}, other handlers take no target'
               WHEN u.ma < 1 OR u.mra < 0 THEN
                   'pass NULL to use the queue''s defaults|max_attempts must be >= 1 and '
                   'max_retry_age_s >= 0'
           END)
      INTO bad
      FROM unnest(keys, handlers, payloads, queues, targets, max_attempts, max_retry_age_s)
           AS u(k, h, p, q, tg, ma, mra)
      LEFT JOIN dispatcher.queues qd ON qd.name = coalesce(u.q, 'default')
      LEFT JOIN dispatcher.handlers hd ON hd.name = u.h;
    IF bad IS NOT NULL THEN
        -- `bad` is 'hint|message': hints never contain '|', messages may (keys do)
        RAISE EXCEPTION 'dispatcher.enqueue: %', substr(bad, strpos(bad, '|') + 1)
            USING ERRCODE = '22023', HINT = split_part(bad, '|', 1);
    END IF;
END
$$;
