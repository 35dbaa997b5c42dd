"""The work poll and the wake-ups (`Wakeups`: whom a change concerns). The poll is one
statement every interval that finds what the claim loops and the due-scan would otherwise each
look for (db/claims.sql `poll_work`): the queues with a ready job this daemon can run, the next
due time, an expired lease.

Wake-ups reach a daemon at once from its own intake and, with `database.wakeups = "listen"`,
from every other process through NOTIFY; the poll is what is left when one is lost, and the
only way work from others arrives with `wakeups = "poll"` (a transaction pooler). Before it,
every queue's claim loop claimed once per `scan_interval_s` when idle and the due-scan ran three
statements: 50 idle queues sent PostgreSQL 62 statements/s (tests/bench/bench_idle.py). Now an
idle claim loop waits for a wake-up (`CLAIM_LOOP_IDLE_S` bounds it should one never come), the
due-scan's own round is a safety net every `DUE_SCAN_IDLE_S`, and a wake-up that names no queue
polls first when there are many queues (`WAKE_EVERY_QUEUE_UP_TO`); one that names its queue
(`ready:<queue>`, intake of one job) wakes that queue's loop alone, at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from dispatcher.config.settings import Settings
from dispatcher.db.jobs import JobRepository, WorkSeen
from dispatcher.engine.due_scan import DueScanner
from dispatcher.engine.worker_pool import WorkerPool
from dispatcher.runtime.lifecycle import Service
from dispatcher.runtime.timing import TimingEngine

log = logging.getLogger(__name__)

# Safety bounds only: the poll covers a lost wake-up. A claim loop's own bound at 30 s still
# cost 50 idle queues 1.7 claims/s.
CLAIM_LOOP_IDLE_S = 600.0
DUE_SCAN_IDLE_S = 30.0
# A wake-up without a queue (a NOTIFY, intake) wakes every claim loop directly up to this many
# queues (a claim that finds nothing costs about what the poll costs); beyond it the poll runs
# at once and wakes the loops of the queues it finds ready. With 50 queues every notice had
# been 50 claims, and a due job waited behind them (p50 90-155 ms, tests/bench/bench_idle.py).
WAKE_EVERY_QUEUE_UP_TO = 2


class WorkPoller(Service):
    """Every `interval_s`: wake the claim loops of the queues with ready work, and the due-scan
    when a job is due (at its due time, when that comes before the next poll) or a lease has
    expired. A failed poll is said once until one succeeds; the next tries again."""

    name = "work-poll"

    def __init__(
        self,
        repo: JobRepository,
        timing: TimingEngine,
        *,
        queues: Sequence[str],
        capabilities: list[str],
        interval_s: float,
        wake_queue: Callable[[str], None],
        scanner: DueScanner,
    ):
        self._repo = repo
        self._timing = timing
        self._queues = list(queues)
        self._capabilities = capabilities
        self.interval_s = interval_s
        self._wake_queue = wake_queue
        self._scanner = scanner
        self._failing = False

    async def start(self) -> None:
        self._timing.every(self.name, self.interval_s, self.run_once)

    async def stop(self) -> None:
        await self._timing.cancel(self.name)

    def wake(self) -> None:
        """Poll now (or once more after the round in flight)."""
        self._timing.run_now(self.name)

    async def run_once(self) -> WorkSeen | None:
        try:
            seen = await self._repo.poll_work(self._queues, self._capabilities)
        except Exception as exc:  # the database may be restarting: the next poll tries again
            if not self._failing:
                log.error("work poll failed (retrying every %.2f s): %s", self.interval_s, exc)
            self._failing = True
            return None
        if self._failing:
            log.warning("work poll works again")
            self._failing = False
        for queue in seen.ready:
            self._wake_queue(queue)
        if seen.lease_expired:
            self._scanner.wake()
        elif seen.next_due_s is not None and seen.next_due_s < self.interval_s:
            self._scanner.wake_in(seen.next_due_s)
        return seen


def poll_interval_s(settings: Settings) -> float:
    """How often the work poll looks: the safety net's interval, or (a transaction pooler, no
    LISTEN) the configured poll interval."""
    if settings.database.wakeups == "poll":
        return settings.database.poll_interval_s
    return settings.scan_interval_s


def _nothing() -> None:
    return None


def _nothing_for(_queue: str) -> None:
    return None


# 'ready:' || queue: a job of that queue is ready and one of its claim loops waits
# (dispatcher.wake_queue); a queue this daemon does not run wakes nothing
READY_IN = "ready:"


class Wakeups:
    """Wakes whom a change concerns: workers for ready work, the scan for new due times.
    Bound once both exist; a wake-up before that is harmless (both look on start)."""

    def __init__(self) -> None:
        self._workers: Callable[[], None] = _nothing
        self._queue: Callable[[str], None] = _nothing_for
        self._scanner: Callable[[], None] = _nothing
        self._settings: Callable[[], None] = _nothing
        self._relay: Callable[[], None] = _nothing

    def bind(
        self,
        workers: WorkerPool,
        scanner: DueScanner,
        poller: WorkPoller,
        settings: Callable[[], None] = _nothing,
        relay: Callable[[], None] = _nothing,
    ) -> None:
        """`relay`: the RabbitMQ outbox relay's wake-up (an idle relay waits for ready work)."""
        self._scanner, self._settings, self._relay = scanner.wake, settings, relay
        # a notice names no queue: past a few queues, one poll finds those with ready work
        # rather than a claim per queue (engine/work_poll.py)
        few = len(workers.workers) <= WAKE_EVERY_QUEUE_UP_TO
        self._workers = workers.wake if few else poller.wake
        self._queue = workers.wake_queue

    def __call__(self, reason: str = "") -> None:
        if reason == "limits":  # a queue's settings changed at run time (migration 025)
            self._settings()
            return
        if reason.startswith(READY_IN):  # a job of one queue: its loop alone, no poll first
            self._relay()
            self._queue(reason[len(READY_IN) :])
            return
        if reason != "scheduled":
            self._relay()  # new outbox rows, perhaps
            self._workers()
        if reason != "ready":
            self._scanner()
