-- name: ready_left
-- Whether queue $1 still has a ready job this worker can run ($2 = handler:version list),
-- claimed by a transaction in flight or not: after a claim that took fewer jobs than it asked,
-- the claim loop claims again at once only then (db/claims.py). NULL: none. In the claim
-- index's order, so stale statistics (every job ready) never make it a sequential scan.
SELECT true FROM dispatcher.job_state s
 WHERE s.queue = $1 AND s.state = 'ready' AND s.capability = ANY ($2::text[])
   AND s.due_at <= now()  -- one the due-scan moved ahead of its due time is not yet runnable
 ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id  -- jobs_ready_claim (migration 023)
 LIMIT 1;

-- name: ready_after_intake
-- `ready_left` for a claim loop that has just taken queue $1's wake gate: first waits (bounded)
-- for the enqueues into it that probed the gate before, so the look sees them
-- (db/functions/10_wake.sql). NULL when that wait ran out.
SELECT dispatcher.ready_after_intake($1, $2::text[]);

-- name: poll_work
-- The one look an idle daemon takes per poll: which of queues $1 (not paused) have a ready job
-- this daemon can run ($2 = handler:version list), how long until the earliest scheduled job
-- is due (NULL: none waiting; as seconds_to_next_due), and whether a lease has expired or a
-- waiting job's TTL passed (either way the due-scan has work: `lease_expired`). One
-- index read each (jobs_ready_claim in its order, jobs_scheduled_due, and jobs_running: its entries, one per running job), in
-- place of one claim per queue and the due-scan's statements every second.
SELECT array(
         SELECT q FROM unnest($1::text[]) q
          WHERE EXISTS (SELECT 1 FROM dispatcher.job_state s
                         WHERE s.queue = q AND s.state = 'ready'
                           AND s.capability = ANY ($2::text[]) AND s.due_at <= now()
                         ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id LIMIT 1)
            AND NOT EXISTS (SELECT 1 FROM dispatcher.queues r WHERE r.name = q AND r.paused)
       ) AS ready,
       (SELECT CASE WHEN min(due_at) IS NULL THEN NULL
                    ELSE greatest(0, extract(epoch FROM min(due_at)) - extract(epoch FROM now()))
               END::float8
          FROM dispatcher.job_state WHERE state = 'scheduled') AS next_due_s,
       -- or a waiting job's time to live has passed: the due-scan ends it (migration 030;
       -- one probe of job_state_expiring, empty without TTLs)
       EXISTS (SELECT 1 FROM dispatcher.job_state
                WHERE state = 'running' AND lease_expires_at < now())
       OR EXISTS (SELECT 1 FROM dispatcher.job_state
                   WHERE expires_at <= now() AND state IN ('scheduled', 'ready'))
       AS lease_expired;
