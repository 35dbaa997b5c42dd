-- Cron run receipts with unit counters: live from the state rows (run_key and state both live
-- there), falling back to the finish snapshot once pruning has removed units. Operators can
-- query this view from psql.
CREATE OR REPLACE VIEW dispatcher.run_receipts AS
SELECT r.run_key, r.schedule, r.period_start, r.via, r.unit_count, r.overlap_decision,
       r.overlap_with, r.created_at, r.released_at, r.finished_at,
       CASE WHEN u.pruned THEN r.succeeded ELSE u.succeeded END AS succeeded,
       CASE WHEN u.pruned THEN r.dead ELSE u.dead END AS dead,
       CASE WHEN u.pruned THEN r.cancelled ELSE u.cancelled END AS cancelled,
       CASE WHEN u.pruned THEN coalesce(r.discarded, 0) ELSE u.discarded END AS discarded
  FROM dispatcher.runs r
 CROSS JOIN LATERAL (
       SELECT count(*)::int AS total,
              count(*) FILTER (WHERE j.state = 'succeeded')::int AS succeeded,
              count(*) FILTER (WHERE j.state = 'dead')::int AS dead,
              count(*) FILTER (WHERE j.state = 'cancelled')::int AS cancelled,
              count(*) FILTER (WHERE j.state = 'discarded')::int AS discarded,
              (r.finished_at IS NOT NULL AND r.succeeded IS NOT NULL
               AND count(*) < r.unit_count) AS pruned
         FROM dispatcher.job_state j
        WHERE j.run_key = r.run_key) u;
