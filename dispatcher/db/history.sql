-- name: history_add
-- Add one daemon's counts since its last flush ($1: a JSON array of rows) to the minute of $2
-- (NULL: now): counts and latency buckets add, the oldest-ready age keeps the larger value.
-- Rows are taken in queue order, so two daemons flushing at once lock them in the same order.
INSERT INTO dispatcher.history AS h
       (queue, minute, started, succeeded, retried, dead, latency, oldest_ready_s)
SELECT r.queue, date_trunc('minute', coalesce($2::timestamptz, now())), r.started, r.succeeded,
       r.retried, r.dead, coalesce(r.latency, '{}'), r.oldest_ready_s
  FROM jsonb_to_recordset($1::jsonb) AS r(queue text, started bigint, succeeded bigint,
                                          retried bigint, dead bigint, latency bigint[],
                                          oldest_ready_s float8)
 ORDER BY r.queue
ON CONFLICT (queue, minute) DO UPDATE
   SET started = h.started + excluded.started,
       succeeded = h.succeeded + excluded.succeeded,
       retried = h.retried + excluded.retried,
       dead = h.dead + excluded.dead,
       latency = dispatcher.history_add_buckets(h.latency, excluded.latency),
       oldest_ready_s = greatest(h.oldest_ready_s, excluded.oldest_ready_s);

-- name: history_read
-- One queue's history ($1; '*': all queues) from $2 up to $3, summed in steps of $4 seconds
-- counted from $2 (latency buckets element by element): one row per step that has any (a
-- primary-key range scan).
WITH minutes AS (
    SELECT date_bin(make_interval(secs => $4), h.minute, $2::timestamptz) AS at, h.*
      FROM dispatcher.history h
     WHERE h.queue = $1 AND h.minute >= $2::timestamptz AND h.minute < $3::timestamptz
), buckets AS (
    SELECT at, array_agg(n ORDER BY i) AS latency
      FROM (SELECT m.at, u.i, sum(u.n)::bigint AS n
              FROM minutes m, unnest(m.latency) WITH ORDINALITY AS u(n, i)
             GROUP BY m.at, u.i) per_bucket
     GROUP BY at
)
SELECT m.at, sum(m.started)::bigint AS started, sum(m.succeeded)::bigint AS succeeded,
       sum(m.retried)::bigint AS retried, sum(m.dead)::bigint AS dead,
       b.latency, max(m.oldest_ready_s) AS oldest_ready_s
  FROM minutes m LEFT JOIN buckets b USING (at)
 GROUP BY m.at, b.latency
 ORDER BY m.at;

-- name: history_recent_starts
-- Attempts started per queue in the current and the previous minute, and how many seconds
-- those cover (the overview's starts/s, for the whole cluster).
SELECT queue, sum(started)::bigint AS started,
       extract(epoch FROM now() - date_trunc('minute', now()))::float8 + 60 AS seconds
  FROM dispatcher.history
 WHERE minute >= date_trunc('minute', now()) - interval '1 minute' AND queue <> '*'
 GROUP BY queue;

-- name: prune_history
-- Delete up to $2 history rows of minutes that ended more than $1 seconds ago; returns how many.
DELETE FROM dispatcher.history
 WHERE ctid = ANY (ARRAY(SELECT ctid FROM dispatcher.history
                          WHERE minute < now() - make_interval(secs => $1) - interval '1 minute'
                          ORDER BY minute LIMIT $2));
