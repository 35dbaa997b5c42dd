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

-- dispatcher.liveness_namespace, liveness_key and liveness_held (whether a session holds an
-- owner's lock) were created here; their bodies: db/functions/10_liveness.sql.
