-- Backup and restore (dispatcher backup / restore). Same format as queries.sql: a name, then one
-- line saying what the statement is for.

-- name: dispatcher_schema_exists
-- Whether this database holds a dispatcher schema at all (restore refuses to overwrite one).
SELECT to_regnamespace('dispatcher') IS NOT NULL;

-- name: backup_contents
-- What a backup or a restore holds: jobs and cron run receipts, counted once it is done.
SELECT (SELECT count(*) FROM dispatcher.jobs)::bigint AS jobs,
       (SELECT count(*) FROM dispatcher.runs)::bigint AS runs;

-- name: daemon_sessions
-- Connections of running daemons (their pools are named dispatcher:<kind>) to this database.
SELECT count(*)::int
  FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE 'dispatcher:%'
   AND pid <> pg_backend_pid();

-- name: server_version_num
-- The server's version as a number (150004, 180006): what a restore script may say to it.
SELECT current_setting('server_version_num')::int;
