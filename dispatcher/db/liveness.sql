-- The liveness lock (migration 022, dispatcher/db/liveness.py). Same format as queries.sql: a
-- name, then one line saying what the statement is for.

-- name: liveness_take
-- Take the liveness lock of owner $1 for this session and register the owner; `held` is false
-- when another session holds it (an earlier session of this daemon the server has not ended).
WITH taken AS (
    SELECT pg_try_advisory_lock(dispatcher.liveness_namespace(), dispatcher.liveness_key($1))
           AS held
), registered AS (
    INSERT INTO dispatcher.instances (owner) SELECT $1 FROM taken WHERE held
    ON CONFLICT (owner) DO NOTHING
)
SELECT held, pg_backend_pid() AS pid FROM taken;

-- name: liveness_look
-- One look, on the lock's own connection: the registered owners other than $1 whose lock no
-- session holds, the server's uptime (every lock vanishes when it restarts), and this session's
-- backend pid (another pid: a pooler in transaction mode moved the session, see recovery.md).
SELECT ARRAY(SELECT i.owner FROM dispatcher.instances i
              WHERE i.owner <> $1 AND NOT dispatcher.liveness_held(i.owner)
              ORDER BY i.owner) AS absent,
       extract(epoch FROM now() - pg_postmaster_start_time())::float8 AS uptime_s,
       pg_backend_pid() AS pid;

-- name: liveness_unregister
-- A daemon that stops cleanly takes its owner id out of the registry (the lock goes with its
-- connection).
DELETE FROM dispatcher.instances WHERE owner = $1;
