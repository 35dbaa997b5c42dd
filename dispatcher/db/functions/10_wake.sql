-- The wake gates (docs/architecture.md, wake-ups): send NOTIFY dispatcher_wake only while some
-- daemon waits to hear it. A transaction that has sent NOTIFY takes one database-wide lock during
-- its commit, held through the WAL flush, so enqueues that each notify commit one at a time and
-- never share a flush: with no daemon to hear it, one-per-call intake ran at a third of the
-- rate it has without (622 against 1,783 jobs/s), and with a daemon running and draining at a
-- quarter (400 against 1,604, docs/performance/index.md "The wake gate (one per call)").
--
-- Two gates, both shared session-level advisory locks on a daemon's wake-up listener connection
-- (db/notifications.py), so every daemon can hold them at once and a killed daemon's go with its
-- session:
-- - the daemon gate (namespace 0x64697377, 'disw'; key 0), held by every listening daemon from
--   its LISTEN on: `dispatcher.wake(reason)`, for a new due time ('scheduled'), for anything
--   ('') and for ready work that names no queue ('ready': a batch, a callback, a key's release);
-- - a queue's gate ('disq', key hashtext(queue)), held only by a claim loop of that queue that
--   is about to wait for work: `dispatcher.wake_queue(queue)`, a job of that queue ready now,
--   notifies ('ready:' || queue) only then. A busy loop (it claims again anyway) does not hold
--   it, so intake into a busy queue sends nothing and its commits share flushes again; a busy
--   queue does not make another queue's intake notify. Over RabbitMQ (`ready_outbox()`) an idle
--   relay waits for ready work, so every ready intake takes the daemon gate instead.
-- Asking for a gate exclusively tells whether any session holds it: refused, someone listens
-- and the notice goes out; granted, nobody does, and the lock is given back in the same
-- expression, so it is held for microseconds, never across a statement (a pooler in
-- transaction mode is safe). The probe reads no table: two lock-table operations.
--
-- The race a queue's gate must close: an enqueue probes (no holder, no notice), a claim loop
-- then takes the gate and looks once more, and the enqueue commits after that look. So an
-- enqueue that sends no notice first takes the queue's intake lock ('disi', the same key)
-- shared until it commits (shared: enqueues never wait for each other), and a loop, after
-- taking the gate, waits for the intake lock exclusively before its look
-- (`dispatcher.ready_after_intake`): every enqueue that probed before the gate has committed by
-- then and the look sees it; one that probes after it notifies. An enqueue whose shared request
-- is refused (a loop waits for the intake lock at that instant) notifies.
-- With wakeups = "poll" no daemon listens, and no enqueue notifies.

-- Whether nobody holds gate (`space`, `k`): asks for it exclusively and, granted, gives it back
-- in the same expression, so no interrupt can fall between the two and it is held for
-- microseconds, never across a statement. A plain SQL expression, inlined where it is called.
CREATE OR REPLACE FUNCTION dispatcher.gate_free(space integer, k integer) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN pg_try_advisory_lock(space, k) THEN pg_advisory_unlock(space, k) ELSE false END
$$;

-- reason: 'ready' (work to claim), 'scheduled' (a new due time) or '' (anything may have changed).
CREATE OR REPLACE FUNCTION dispatcher.wake(reason text DEFAULT '') RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF reason IS NULL OR reason NOT IN ('ready', 'scheduled', '') THEN
        RAISE EXCEPTION 'dispatcher.wake: unknown reason %', quote_nullable(reason)
            USING ERRCODE = '22023',
                  HINT = 'use ''ready'' (work to claim), ''scheduled'' (a new due time) or '''' (look at everything)';
    END IF;
    IF NOT dispatcher.gate_free(1684632439, 0) THEN  -- a daemon listens
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

-- Whether some daemon holds the daemon gate, that is, listens (pg_locks, for tests and operators;
-- the probe in dispatcher.wake reads no view).
CREATE OR REPLACE FUNCTION dispatcher.wake_gate_held() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock'
           AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND l.classid = 1684632439::oid AND l.objid = 0::oid)
$$;

-- A job of `queue` is ready now: notify ('ready:' || queue) only while a claim loop of that
-- queue waits for work (its gate), and otherwise hold the queue's intake lock until commit (see
-- the header). Over RabbitMQ (`ready_outbox()`) the relays wait for ready work: the caller,
-- which has read that setting already, calls `wake('ready')` instead.
CREATE OR REPLACE FUNCTION dispatcher.wake_queue(queue text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k integer;
BEGIN
    IF queue IS NULL THEN
        PERFORM dispatcher.wake('ready');
        RETURN;
    END IF;
    -- no daemon listens (the daemon gate is free): no loop can hold a queue's gate, so neither
    -- a notice nor the intake lock is wanted. Every enqueue holding that one lock shared until
    -- its commit cost one-per-call intake with no daemon about a third (1,867 -> 1,276 jobs/s,
    -- docs/performance/index.md). A daemon whose listener takes the gate after this probe
    -- waits for this transaction before its first look, which finds the job
    -- (db/notifications.py); one left open past that wait's bound, by the work poll.
    IF dispatcher.gate_free(1684632439, 0) THEN
        RETURN;
    END IF;
    k := hashtext(queue);
    -- the intake lock first: a loop that takes the gate after this probe waits for our commit
    IF pg_try_advisory_xact_lock_shared(1684632425, k) THEN
        IF dispatcher.gate_free(1684632433, k) THEN
            RETURN;  -- no loop of this queue waits: it claims again anyway, or none runs
        END IF;
    END IF;
    PERFORM pg_notify('dispatcher_wake', 'ready:' || queue);
END
$$;

-- A claim loop about to wait for work of `queue` takes the queue's gate on its daemon's
-- listener connection (from then on, intake into the queue notifies); shared, as every loop of
-- the queue in every daemon may wait at once. Bounded like hold_wake_gate.
CREATE OR REPLACE FUNCTION dispatcher.hold_queue_gate(queue text) RETURNS void
LANGUAGE sql VOLATILE SET lock_timeout = '5s' AS $$
    SELECT pg_advisory_lock_shared(1684632433, hashtext(queue))
$$;

-- The loop is busy again: intake into the queue need not notify (for this daemon). False when
-- the session did not hold it (a reconnect lost it already).
CREATE OR REPLACE FUNCTION dispatcher.let_go_queue_gate(queue text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_unlock_shared(1684632433, hashtext(queue))
$$;

-- After taking the queue's gate: wait until every enqueue into `queue` that probed before it
-- has committed (the intake lock, exclusively, for an instant), then, with a fresh snapshot,
-- whether a ready job of `queue` this daemon can run ($2 = handler:version list) is there.
-- NULL when an enqueue transaction stays open past the bound (1 s): the loop claims again and
-- comes back to wait once more, rather than hold a connection it shares with other queues'
-- claims (a business transaction left open costs that queue a claim a second until it ends).
-- Its plan is kept per connection: the daemon's sessions plan every statement with its values
-- (plan_cache_mode), which cost this probe 0.19 ms of planning per call against 0.013 ms of
-- execution (W3, pg_stat_statements), on the path of a claim loop going idle. A plan kept from
-- an empty table's statistics would read the state rows whole: sequential scans are off.
CREATE OR REPLACE FUNCTION dispatcher.ready_after_intake(queue text, capabilities text[])
RETURNS boolean
LANGUAGE plpgsql VOLATILE SET lock_timeout = '1s' SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off AS $$
BEGIN
    BEGIN
        PERFORM pg_advisory_xact_lock(1684632425, hashtext(queue));
    EXCEPTION WHEN lock_not_available THEN
        RETURN NULL;
    END;
    -- a volatile function's statement takes a new snapshot: the commits waited for are in it
    RETURN EXISTS (
        SELECT 1 FROM dispatcher.job_state s
         WHERE s.queue = ready_after_intake.queue AND s.state = 'ready'
           AND s.capability = ANY (ready_after_intake.capabilities)
           AND s.due_at <= now()  -- not one moved ahead of its due time (queries.sql scan_due)
         ORDER BY s.queue, s.priority, s.tenant, s.due_at, s.id  -- jobs_ready_claim
         LIMIT 1);
END
$$;

-- Whether some claim loop of `queue` waits for work, holding its gate (pg_locks, for tests and
-- operators).
CREATE OR REPLACE FUNCTION dispatcher.wake_gate_held(queue text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock'
           AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND l.classid = 1684632433::oid AND l.objid = hashtext(queue)::oid)
$$;
