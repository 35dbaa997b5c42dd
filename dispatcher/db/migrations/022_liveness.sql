-- Crash recovery in seconds (issue 20, Build 5; docs/recovery.md).
--
-- Before: a daemon killed with jobs running left them `running` until their leases expired
-- (lease_s, 60 s by default): seed 000's 4,000 jobs waited a minute after a SIGKILL.
--
-- Now every daemon, before it claims anything, holds a session-level advisory lock named by its
-- lease owner id on a connection of its own (dispatcher/db/liveness.py), and registers that
-- owner here. PostgreSQL drops a session's locks when its backend ends, and the backend ends
-- when the process's socket closes: at once for a SIGKILL or an OOM kill. A registered owner
-- whose lock nobody holds is gone; once the others have seen it so for a confirmation period,
-- the scan rescues its running jobs as if their leases had expired (rescue_expired_leases).
-- A process that is alive but frozen (SIGSTOP) keeps its socket, so its session and its lock:
-- it waits out its leases as before.
--
-- Only registered owners are judged by their lock: a daemon of an earlier release (rolling
-- upgrade) holds no such lock and keeps the lease rule alone.

CREATE TABLE dispatcher.instances (
    owner      text PRIMARY KEY,             -- the lease owner id (daemon.instance_owner)
    started_at timestamptz NOT NULL DEFAULT now()
);

-- The lock's key: (namespace, hash of the owner id). The two-integer form shows in pg_locks as
-- classid = namespace, objid = key, objsubid = 2. A hash shared by two owners only delays a
-- rescue (one looks alive while the other lives) to the lease expiry; it never rescues early.
CREATE FUNCTION dispatcher.liveness_namespace() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1684632436 $$;  -- 0x64697374, 'dist'

CREATE FUNCTION dispatcher.liveness_key(owner text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtext(owner) $$;

-- Whether some session of this database holds `owner`'s liveness lock (pg_locks is readable by
-- every role). The rescue asks it again in the statement that rescues, so an owner that took its
-- lock back after it was judged gone keeps its jobs.
CREATE FUNCTION dispatcher.liveness_held(owner text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND l.classid = dispatcher.liveness_namespace()::oid
           AND l.objid = dispatcher.liveness_key(owner)::oid)
$$;
