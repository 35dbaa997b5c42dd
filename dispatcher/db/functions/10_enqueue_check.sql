
CREATE OR REPLACE FUNCTION dispatcher.enqueue_check(
    keys text[], handlers text[], payloads jsonb[], queues text[], targets jsonb[],
    max_attempts integer[], max_retry_age_s integer[], priorities integer[] DEFAULT NULL,
    concurrency_keys text[] DEFAULT NULL
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
               WHEN u.pr NOT BETWEEN -100 AND 100 THEN
                   format('a priority is an integer from -100 to 100, lower runs first (default '
                          '0)|priority %s is out of range', u.pr)
               WHEN length(u.ck) > 200 THEN
                   format('a concurrency_key is 1 to 200 characters; NULL for the tenant, '''' '
                          'for none|concurrency_key is %s characters long', length(u.ck))
           END)
      INTO bad
      FROM unnest(keys, handlers, payloads, queues, targets, max_attempts, max_retry_age_s,
                  priorities, concurrency_keys)
           AS u(k, h, p, q, tg, ma, mra, pr, ck)
      LEFT JOIN dispatcher.queues qd ON qd.name = coalesce(u.q, 'default')
      LEFT JOIN dispatcher.handlers hd ON hd.name = u.h;
    IF bad IS NOT NULL THEN
        -- `bad` is 'hint|message': hints never contain '|', messages may (keys do)
        RAISE EXCEPTION 'dispatcher.enqueue: %', substr(bad, strpos(bad, '|') + 1)
            USING ERRCODE = '22023', HINT = split_part(bad, '|', 1);
    END IF;
END
$$;
