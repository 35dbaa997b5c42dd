-- name: queue_settings
-- Every queue's settings from the file and its run-time overrides (the daemons' one-second look).
SELECT name, file_settings, overrides, overrides_at
  FROM dispatcher.queues
 ORDER BY name;

-- name: record_file_settings
-- At start: the settings the file gives queue $1 ($2), then the settings in force (overrides win).
WITH recorded AS (
    UPDATE dispatcher.queues SET file_settings = $2 WHERE name = $1
    RETURNING name, overrides
)
SELECT dispatcher.apply_queue_settings(name) FROM recorded WHERE overrides <> '{}';

-- name: set_queue_overrides
-- Merge run-time overrides $2 into queue $1's (a JSON merge patch: null removes one); none: NULL.
UPDATE dispatcher.queues
   SET overrides = jsonb_strip_nulls(overrides || $2::jsonb), overrides_at = now()
 WHERE name = $1
RETURNING name, file_settings, overrides, overrides_at;

-- name: reset_queue_overrides
-- Remove every run-time override of queue $1: the file's settings hold again; none: NULL.
UPDATE dispatcher.queues SET overrides = '{}', overrides_at = now()
 WHERE name = $1
RETURNING name, file_settings, overrides, overrides_at;

-- name: apply_queue_settings
-- Put queue $1's settings in force into its limit columns and notify every daemon.
SELECT dispatcher.apply_queue_settings($1);

-- name: ready_priority_mix
-- The console's queue page: ready jobs of queue $1 per priority, among at most $2 of them.
SELECT priority, count(*)::bigint AS jobs
  FROM (SELECT s.priority FROM dispatcher.job_state s
         WHERE s.queue = $1 AND s.state = 'ready' LIMIT $2) r
 GROUP BY priority
 ORDER BY priority;

-- name: ready_top_tenants
-- The console's queue page: the $3 tenants with most ready jobs in queue $1, among at most $2.
SELECT tenant, count(*)::bigint AS jobs
  FROM (SELECT s.tenant FROM dispatcher.job_state s
         WHERE s.queue = $1 AND s.state = 'ready' LIMIT $2) r
 GROUP BY tenant
 ORDER BY jobs DESC, tenant
 LIMIT $3;

-- name: keys_at_limit
-- The console's queue page: the concurrency keys of queue $1 that may start nothing now (024).
SELECT dispatcher.keys_at_limit($1) AS keys;
