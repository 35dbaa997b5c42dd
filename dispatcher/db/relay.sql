-- The RabbitMQ transport's statements: the outbox relay and the consumer's claim. Same
-- conventions as queries.sql.

-- name: lease_outbox
-- Relay: lease up to $1 outbox rows nobody holds (oldest first) for $2 seconds; each with what
-- its message carries (the job's key and the attempt it is ready to start after).
WITH picked AS (
    SELECT o.id FROM dispatcher.outbox o
     WHERE o.leased_until IS NULL OR o.leased_until < now()
     ORDER BY o.id
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE dispatcher.outbox o SET leased_until = now() + make_interval(secs => $2)
     WHERE o.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING o.id, o.job_id, o.queue, o.created_at
)
SELECT l.id, l.job_id, l.queue, j.key, j.attempt,
       extract(epoch FROM now() - l.created_at)::float8 AS age_s
  FROM leased l JOIN dispatcher.jobs j ON j.id = l.job_id;

-- name: delete_outbox_rows
-- Relay: the broker confirmed these rows' messages ($1 ids); they are delivered.
DELETE FROM dispatcher.outbox WHERE id = ANY ($1::bigint[]);

-- name: claim_delivered
-- Consumer: lease the delivered jobs ($2 ids, $3 the attempt each message was published after)
-- of queue $1 that this process can run ($6 handler:version pairs) to owner $4 for $5 seconds,
-- within the queue's global limits. A job no longer ready, or ready for another attempt, is not
-- eligible (a duplicate delivery). A ready job this process cannot run (a mixed-version fleet)
-- is refused: a new outbox row, published again after a second, carries it to another daemon.
-- The last row is always the marker: the eligible ids (those not claimed were held back by the
-- limits), the refused ids and the limiter's wait.
WITH grant_ AS MATERIALIZED (
    SELECT granted, wait_s FROM dispatcher.claim_grant($1, cardinality($2::bigint[]))
), ready AS MATERIALIZED (
    SELECT k.id, k.tenant, k.handler || ':' || k.handler_version AS capability
      FROM unnest($2::bigint[], $3::integer[]) AS d(id, attempt)
      JOIN dispatcher.jobs k ON k.id = d.id AND k.attempt = d.attempt
     WHERE k.state = 'ready' AND k.queue = $1
), eligible AS MATERIALIZED (
    SELECT id FROM ready WHERE capability = ANY ($6::text[])
), refused AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, leased_until)
    SELECT id, $1, tenant, capability, now() + interval '1 second'
      FROM ready WHERE NOT capability = ANY ($6::text[])
    RETURNING job_id
), claimed AS (
    UPDATE dispatcher.jobs j
       SET state = 'running', attempt = j.attempt + 1, lease_owner = $4,
           lease_expires_at = now() + make_interval(secs => $5), started_at = now()
     WHERE j.id = ANY (ARRAY(SELECT id FROM eligible ORDER BY id
                              LIMIT (SELECT granted FROM grant_)))
       AND j.state = 'ready'
    RETURNING j.id, j.key, j.queue, j.tenant, j.handler, j.handler_version, j.target, j.payload,
              j.attempt, j.max_attempts,
              least(greatest(j.due_at, lower(dispatcher.due_at_range())),
                    upper(dispatcher.due_at_range())) AS due_at,
              j.progress, j.run_key,
              CASE WHEN j.due_at <@ dispatcher.due_at_range()
                   THEN extract(epoch FROM now() - j.due_at) ELSE 0 END::float8 AS due_to_start_s,
              j.traceparent  -- the 15th column, as in claim_ready
)
SELECT c.*, NULL::bigint[] AS eligible, NULL::bigint[] AS refused, NULL::float8 AS wait_s
  FROM claimed c
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       ARRAY(SELECT id FROM eligible), ARRAY(SELECT job_id FROM refused),
       dispatcher.claim_settle($1, g.granted, (SELECT count(*) FROM claimed)::int, g.wait_s)
  FROM grant_ g;
