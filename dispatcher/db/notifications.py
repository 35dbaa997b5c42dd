"""LISTEN for wake-ups from other instances and from the SQL door (channel `dispatcher_wake`),
and the start-up check that the database URL keeps a session, without which LISTEN hears
nothing (docs/pooling.md).

The listener connection also holds the wake gates (db/functions/10_wake.sql): intake sends
NOTIFY only while some session holds the gate it probes, because a transaction that notifies
commits behind every other notifier. The daemon gate (new due times, notices naming no queue) is
taken after LISTEN and before the first look for work, and kept: a job committed before the look
is found by it, an enqueue that probes the gate after it is taken notifies, and is heard. A
queue's gate is taken for a claim loop about to wait for work (`hold_queue_gate`) and given back
when the loop is busy again (`let_go_queue_gate`); the loop then looks once more after the
queue's intake settled (engine/wake_gates.py). Every daemon holds its gates itself (shared
locks), so when one dies the others hold theirs already and nothing is taken over; a listener
that reconnects takes the daemon gate and every queue gate still wanted again.

Taking the daemon gate leaves one race the gate cannot close by itself: an enqueue that probed it
just before (no daemon listened: no notice, and no queue intake lock either, which would cost
every enqueue with no daemon a third of its rate) and commits just after the daemon's look for
what was missed. So before that look the listener waits until every transaction that was open
once it held the gates has ended (bounded: `OPEN_WAIT_S`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from dispatcher.db.pool import POOLER_FIX, RECONNECT_ERRORS, PoolerError
from dispatcher.runtime.lifecycle import LoopService

log = logging.getLogger(__name__)

CHANNEL = "dispatcher_wake"
CHECK_TIMEOUT_S = 2.0
# A transaction id of its own, taken once the gates are held, and whether any transaction older
# than it is still open. An enqueue probes the gates after its first write, so it has an id by
# then, older than ours. (A snapshot's list of open ids does not do: an open id above the newest
# ended one falls past the snapshot's xmax, and is not listed.)
OWN_XID = "SELECT pg_current_xact_id()::text"
OLDER_OPEN = "SELECT pg_snapshot_xmin(pg_current_snapshot()) < $1::text::xid8"
# The listener's first look waits for them at most this long, asking from every 5 ms up to
# every 100 ms: an enqueue commits within milliseconds of its probe; a business transaction
# left open longer is not waited for (its job is found by the work poll, scan_interval_s).
OPEN_WAIT_S = 2.0
FIRST_ASK_S, LAST_ASK_S = 0.005, 0.1


async def check_sessions_stay(dsn: str) -> None:
    """Raise PoolerError when consecutive statements of one connection may run in different
    server sessions. One connection reads its backend pid; a second one opens a transaction,
    which a transaction pooler serves with the server session just freed (PgBouncer hands out
    the most recently used); the first reads its pid again. A direct connection or a
    session-mode pool gives the same pid; a transaction pooler another one, or none until the
    transaction ends (a pool of one server session). No statement cache: a named prepared
    statement would itself fail behind such a pooler."""
    options = {"application_name": "dispatcher:session-check"}
    first = await asyncpg.connect(dsn, statement_cache_size=0, server_settings=options)
    second = await asyncpg.connect(dsn, statement_cache_size=0, server_settings=options)
    try:
        pid = await first.fetchval("SELECT pg_backend_pid()")
        async with second.transaction():
            await second.fetchval("SELECT pg_backend_pid()")
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_S):
                    again = await first.fetchval("SELECT pg_backend_pid()")
            except TimeoutError:
                again = None
        if again != pid:
            raise PoolerError(POOLER_FIX)
    finally:
        for conn in (first, second):
            conn.terminate()


class WakeListener(LoopService):
    """Holds one connection LISTENing, and the wake gates on it; reconnects when it drops.

    Calls `on_wake(payload)` per notice: "ready" (work to claim), "ready:<queue>" (work to claim
    in that queue), "scheduled" (a new due time), or "" (anything may have changed).

    Queue gates: `hold_gate(queue)` takes one (at most once, whatever the number of calls) and
    says whether it was taken since the loop last settled (the loop must then look again after
    the queue's intake settled); `let_go(queue)` gives it back in the background. Statements on
    the connection run one at a time (`_busy`); a gate wanted while the connection is down is
    taken at the reconnect, before the look for what was missed.
    """

    name = "wake-listener"

    def __init__(self, dsn: str, on_wake: Callable[[str], None], reconnect_s: float = 1.0):
        self._dsn = dsn
        self._on_wake = on_wake
        self._reconnect_s = reconnect_s
        self._conn: asyncpg.Connection | None = None
        self._busy = asyncio.Lock()
        self._wanted: set[str] = set()  # queues whose loops wait for work
        self._held: set[str] = set()  # queue gates this connection's session holds
        self._unsettled: set[str] = set()  # held, but no loop looked after taking them
        self._letting_go: set[asyncio.Task[None]] = set()
        self._letting_go_of: set[str] = set()  # queues with a let-go task not yet done

    async def hold_gate(self, queue: str) -> bool:
        """Hold `queue`'s gate. True: taken since the loop's last look after one (look again,
        after the queue's intake settled); False: held and looked after already, or no
        connection now (the reconnect takes it and wakes every loop)."""
        self._wanted.add(queue)
        # a let-go under way may give the gate back after this call: wait for it, then look
        if queue not in self._held or queue in self._letting_go_of:
            async with self._busy:
                conn = self._conn
                if conn is None or queue not in self._wanted:
                    return False
                if queue not in self._held:
                    try:
                        await conn.execute("SELECT dispatcher.hold_queue_gate($1)", queue)
                    except Exception as exc:  # the reconnect takes it, and wakes the loops
                        log.warning("could not take the wake gate of queue %s: %s", queue, exc)
                        return False
                    self._held.add(queue)
                    self._unsettled.add(queue)
        if queue in self._unsettled:
            self._unsettled.discard(queue)
            return True
        return False

    def look_again(self, queue: str) -> None:
        """The loop's look after taking `queue`'s gate did not happen: the next `hold_gate`
        says True again."""
        if queue in self._held:
            self._unsettled.add(queue)

    def let_go(self, queue: str) -> None:
        """`queue`'s loop is busy: give its gate back (in the background; a `hold_gate` before
        that runs keeps it)."""
        self._wanted.discard(queue)
        if queue in self._held and queue not in self._letting_go_of:
            self._letting_go_of.add(queue)
            task = asyncio.create_task(self._let_go(queue))
            self._letting_go.add(task)
            task.add_done_callback(self._letting_go.discard)

    async def _let_go(self, queue: str) -> None:
        try:
            async with self._busy:
                conn = self._conn
                if queue in self._wanted or queue not in self._held or conn is None:
                    return
                with contextlib.suppress(Exception):  # lost with the session anyway
                    await conn.execute("SELECT dispatcher.let_go_queue_gate($1)", queue)
                self._held.discard(queue)
                self._unsettled.discard(queue)
        finally:
            self._letting_go_of.discard(queue)

    async def _hold_all(self, conn: asyncpg.Connection) -> None:
        """After LISTEN: the daemon gate, and the gates of loops waiting now."""
        # the wait is bounded in the functions: a gate it cannot have is an error, and a reconnect
        await conn.execute("SELECT dispatcher.hold_wake_gate()")
        for queue in sorted(self._wanted):
            await conn.execute("SELECT dispatcher.hold_queue_gate($1)", queue)
            self._held.add(queue)
            self._unsettled.add(queue)

    @staticmethod
    async def _until_open_ended(conn: asyncpg.Connection) -> None:
        """After the gates: wait (bounded) until the transactions open now have ended,
        committed or not. The enqueues among them that probed the daemon gate before it was
        taken sent no notice, and the look that follows must see them."""
        own = await conn.fetchval(OWN_XID)
        ask_in = FIRST_ASK_S
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(OPEN_WAIT_S):
                while await conn.fetchval(OLDER_OPEN, own):
                    await asyncio.sleep(ask_in)
                    ask_in = min(2 * ask_in, LAST_ASK_S)

    async def _run(self) -> None:
        failing = False  # said once per episode: a full server refuses every second for long
        while True:
            conn = None
            try:
                conn = await asyncpg.connect(
                    self._dsn, server_settings={"application_name": "dispatcher:wake-listener"}
                )
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, lambda *args: self._on_wake(args[-1]))
                async with self._busy:  # after LISTEN: from here on every notice sent is heard
                    self._held.clear()
                    await self._hold_all(conn)
                    await self._until_open_ended(conn)  # the look below sees them (docstring)
                    self._conn = conn
                if failing:
                    log.warning("wake-up listener connected again")
                    failing = False
                self._on_wake("")  # notices sent while we were not listening are lost: look now
                await lost.wait()
                log.warning("wake-up listener connection lost; reconnecting")
            except RECONNECT_ERRORS as exc:
                if not failing:
                    log.warning(
                        "wake-up listener cannot connect or listen (retrying every %.0f s): %s",
                        self._reconnect_s,
                        exc,
                    )
                failing = True
            finally:
                self._conn = None
                self._held.clear()
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            await asyncio.sleep(self._reconnect_s)
