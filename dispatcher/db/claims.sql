-- name: ready_left
-- Whether queue $1 still has a ready job this worker can run ($2 = handler:version list),
-- claimed by a transaction in flight or not: after a claim that took fewer jobs than it asked,
-- the claim loop claims again at once only then (db/claims.py). NULL: none. In the claim
-- index's order, so stale statistics (every job ready) never make it a sequential scan.
SELECT true FROM dispatcher.job_state s
 WHERE s.queue = $1 AND s.state = 'ready' AND s.capability = ANY ($2::text[])
 ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id  -- jobs_ready_claim (migration 023)
 LIMIT 1;
