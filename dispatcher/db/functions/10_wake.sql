-- The wake gate (docs/architecture.md, wake-ups): send NOTIFY dispatcher_wake only while a
-- daemon listens. A transaction that has sent NOTIFY takes one database-wide lock during its
-- commit, held through the WAL flush, so enqueues that each notify commit one at a time and
-- never share a flush: with no daemon to hear it, one-per-call intake ran at a third of the
-- rate it has without (622 against 1,783 jobs/s, docs/performance/index.md).
--
-- Every daemon that LISTENs holds the gate, a shared session-level advisory lock (namespace
-- 0x64697377, 'disw'; key 0), on its listener connection (db/notifications.py). Asking for the
-- same lock exclusively tells whether any session holds it: refused, a daemon listens and the
-- notice goes out; granted, none does, and the lock is given back in the same expression, so
-- it is held for microseconds, never across a statement (a pooler in transaction mode is safe)
-- and two callers rarely meet (when they do, one notifies: harmless). The probe reads no table
-- and costs two lock-table operations, against a commit queued behind every other notifier.
--
-- A daemon takes the gate after its LISTEN and then looks for work: a job committed before
-- that look is found by it, and an enqueue that probes after the gate is taken is announced;
-- a transaction that probed before and commits after the look is found by the work poll.
-- With wakeups = "poll" no daemon listens, and no enqueue notifies.
-- reason: 'ready' (work to claim), 'scheduled' (a new due time) or '' (anything may have changed).
CREATE OR REPLACE FUNCTION dispatcher.wake(reason text DEFAULT '') RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF reason IS NULL OR reason NOT IN ('ready', 'scheduled', '') THEN
        RAISE EXCEPTION 'dispatcher.wake: unknown reason %', quote_nullable(reason)
            USING ERRCODE = '22023',
                  HINT = 'use ''ready'' (work to claim), ''scheduled'' (a new due time) or '''' (look at everything)';
    END IF;
    -- one expression: no interrupt can fall between taking the probe's lock and giving it back
    IF NOT (CASE WHEN pg_try_advisory_lock(1684632439, 0)
                 THEN pg_advisory_unlock(1684632439, 0) ELSE false END) THEN
        PERFORM pg_notify('dispatcher_wake', reason);
    END IF;
END
$$;

-- Take the gate for this session: a listening daemon's listener connection calls it after its
-- LISTEN and keeps it until the session ends (a killed daemon's socket closes, and with it
-- the lock). Shared, so every listening daemon holds it at once and none has to take it over
-- from another. It waits only for probes in flight (microseconds); the 5 s bound turns a gate
-- that cannot be had into an error (the listener reconnects) rather than a silent hang. A
-- function-level setting, not a startup parameter: a session-mode pooler refuses those.
CREATE OR REPLACE FUNCTION dispatcher.hold_wake_gate() RETURNS void
LANGUAGE sql VOLATILE SET lock_timeout = '5s' AS $$
    SELECT pg_advisory_lock_shared(1684632439, 0)
$$;

-- Whether some daemon holds the gate, that is, listens (pg_locks, for tests and operators; the
-- probe in dispatcher.wake reads no view).
CREATE OR REPLACE FUNCTION dispatcher.wake_gate_held() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock'
           AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND l.classid = 1684632439::oid AND l.objid = 0::oid)
$$;
