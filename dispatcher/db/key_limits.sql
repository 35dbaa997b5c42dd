-- Per-key limit overrides (migration 024): one key of a queue gets limits of its own instead of
-- the queue's key_max_inflight, key_rate_per_s and key_burst. Same conventions as queries.sql.

-- name: set_key_limits
-- Key $2 of queue $1 gets these limits ($3 max_inflight, $4 rate_per_s, $5 burst; NULL: the
-- queue's); its bucket never holds more than the new burst. No row: the queue does not exist.
WITH known AS (
    SELECT q.name FROM dispatcher.queues q WHERE q.name = $1
), saved AS (
    INSERT INTO dispatcher.key_limits AS o (queue, key, max_inflight, rate_per_s, burst)
    SELECT name, $2, $3, $4, $5 FROM known
        ON CONFLICT (queue, key) DO UPDATE
       SET max_inflight = excluded.max_inflight, rate_per_s = excluded.rate_per_s,
           burst = excluded.burst, updated_at = now()
    RETURNING o.queue, o.key, o.max_inflight, o.rate_per_s, o.burst, o.updated_at
), capped AS (
    UPDATE dispatcher.key_state k SET tokens = least(k.tokens, coalesce($5, k.tokens))
     WHERE k.queue = $1 AND k.key = $2 AND EXISTS (SELECT 1 FROM saved)
)
SELECT * FROM saved;

-- name: clear_key_limits
-- Key $2 of queue $1 goes back to the queue's limits; true when it had an override.
DELETE FROM dispatcher.key_limits WHERE queue = $1 AND key = $2 RETURNING true;

-- name: key_overrides
-- The overrides of queue $1, by key.
SELECT queue, key, max_inflight, rate_per_s, burst, updated_at
  FROM dispatcher.key_limits WHERE queue = $1
 ORDER BY key;
