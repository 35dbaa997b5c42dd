-- Bulk actions on jobs (migration 037; dispatcher.operator.bulk walks them). A selection is
-- read in pages by the job list's own statement (list_jobs, newest first, so every filter of
-- the list is a filter of a bulk action); the statements here read a selection of ids, move one
-- batch, and keep the action's record. Each move locks its rows FOR UPDATE SKIP LOCKED and
-- takes only jobs still in a state the action applies to: a row a claim or another bulk action
-- holds, or that moved on since it was read, is left alone and counted as busy.

-- name: bulk_fence
-- The highest job id now: a bulk action takes no job created after it began.
SELECT coalesce(max(id), 0)::bigint FROM dispatcher.job_state;

-- name: bulk_seen_ids
-- A page of a selection by ids ($1): the jobs that exist, below id $2 (NULL: from the top),
-- newest first, at most $3.
SELECT id, state FROM dispatcher.job_state
 WHERE id = ANY ($1::bigint[]) AND ($2::bigint IS NULL OR id < $2)
 ORDER BY id DESC
 LIMIT $3;

-- name: bulk_retry
-- Retry the dead, cancelled or discarded jobs among $1 (retry_job's change): ready now with a
-- fresh attempt budget, and an outbox row where the relay needs one.
WITH picked AS (
    SELECT id FROM dispatcher.job_state
     WHERE id = ANY ($1::bigint[]) AND state IN ('dead', 'cancelled', 'discarded')
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE dispatcher.job_state s
       SET state = 'ready', attempt = 0, due_at = now(), budget_started_at = now(),
           finished_at = NULL, dead_reason = NULL, cancel_requested = false
      FROM picked p WHERE s.id = p.id
    RETURNING s.id, s.queue, s.tenant, s.capability, s.priority, s.state
), outboxed AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
    SELECT id, queue, tenant, capability, priority FROM moved WHERE dispatcher.ready_outbox()
)
SELECT id, queue, state FROM moved;

-- name: bulk_cancel
-- Cancel the waiting jobs among $1 at once (cancel_job's change); a running one is asked to
-- stop and is not retried.
WITH picked AS (
    SELECT id, state FROM dispatcher.job_state
     WHERE id = ANY ($1::bigint[]) AND state IN ('scheduled', 'ready', 'running')
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE dispatcher.job_state s
       SET state = CASE WHEN p.state = 'running' THEN s.state ELSE 'cancelled' END,
           finished_at = CASE WHEN p.state = 'running' THEN s.finished_at ELSE now() END,
           cancel_requested = (p.state = 'running')
      FROM picked p WHERE s.id = p.id
    RETURNING s.id, s.queue, s.state
), unqueued AS (
    DELETE FROM dispatcher.outbox o USING moved m WHERE o.job_id = m.id AND m.state = 'cancelled'
)
SELECT id, queue, state FROM moved;

-- name: bulk_discard
-- Discard the dead jobs among $1 (discard_job's change): terminal `discarded`.
WITH picked AS (
    SELECT id FROM dispatcher.job_state
     WHERE id = ANY ($1::bigint[]) AND state = 'dead'
       FOR UPDATE SKIP LOCKED
)
UPDATE dispatcher.job_state s SET state = 'discarded'
  FROM picked p WHERE s.id = p.id
RETURNING s.id, s.queue, s.state;

-- name: bulk_reschedule
-- Move the jobs among $1 that are in one of the states $3 to due time $2 (NULL: now), as
-- reschedule_job does: `scheduled` when later than now, else `ready`; a job never attempted
-- measures its retry age from the new due time. A ready job made scheduled loses its outbox
-- row, a scheduled one made ready gets one where the relay needs it.
WITH picked AS (
    SELECT id, state FROM dispatcher.job_state
     WHERE id = ANY ($1::bigint[]) AND state = ANY ($3::text[])
       FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE dispatcher.job_state s
       SET due_at = coalesce($2, now()),
           state = CASE WHEN coalesce($2, now()) > now() THEN 'scheduled' ELSE 'ready' END,
           budget_started_at = CASE WHEN s.attempt = 0 THEN greatest($2, now())
                                    ELSE s.budget_started_at END
      FROM picked p WHERE s.id = p.id
    RETURNING s.id, s.queue, s.tenant, s.capability, s.priority, s.state, p.state AS was
), withdrawn AS (
    DELETE FROM dispatcher.outbox o USING moved m
     WHERE o.job_id = m.id AND m.was = 'ready' AND m.state = 'scheduled'
), outboxed AS (
    INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, priority)
    SELECT id, queue, tenant, capability, priority FROM moved
     WHERE state = 'ready' AND was = 'scheduled' AND dispatcher.ready_outbox()
)
SELECT id, queue, state FROM moved;

-- name: bulk_begin
-- The record of bulk action $1 (key): created with its action $2, fingerprint $3, actor $4
-- and fence $5 when new, else the one that exists (`created` says which).
WITH made AS (
    INSERT INTO dispatcher.bulk_actions (key, action, request_hash, actor, fence_id)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (key) DO NOTHING
    RETURNING id, key, action, request_hash, fence_id, cursor_id, counts, created_at,
              finished_at, true AS created
)
SELECT * FROM made
UNION ALL
SELECT id, key, action, request_hash, fence_id, cursor_id, counts, created_at, finished_at,
       false
  FROM dispatcher.bulk_actions WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM made);

-- name: bulk_turn
-- A batch's first statement: lock bulk action $1's record if its walk is still where this
-- walker left it ($2) and not over. A second request walking the same action waits here for
-- the first one's batch, then finds the walk moved on (no row) before it locked any job.
SELECT id FROM dispatcher.bulk_actions
 WHERE id = $1 AND cursor_id IS NOT DISTINCT FROM $2::bigint AND finished_at IS NULL
   FOR UPDATE;

-- name: bulk_progress
-- After a batch, in its transaction: bulk action $1 has looked at every job down to id $2,
-- with the counts $3 so far; $4 true when the walk is over (bulk_turn locked the record; the
-- check is repeated: only if the walk was where this walker left it, $5, and is not over).
UPDATE dispatcher.bulk_actions
   SET cursor_id = $2, counts = $3, finished_at = CASE WHEN $4 THEN now() END
 WHERE id = $1 AND cursor_id IS NOT DISTINCT FROM $5::bigint AND finished_at IS NULL
RETURNING id;

-- name: prune_bulk_actions
-- Forget up to $2 finished bulk actions older than $1 seconds (the dead retention): from then
-- on their keys may name new bulk actions.
DELETE FROM dispatcher.bulk_actions
 WHERE id IN (SELECT id FROM dispatcher.bulk_actions
               WHERE finished_at < now() - make_interval(secs => $1)
               ORDER BY finished_at LIMIT $2);
