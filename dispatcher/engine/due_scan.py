"""The due-scan: moves due jobs to ready (with their outbox rows) and rescues expired leases,
and the running jobs of daemons judged gone (docs/recovery.md).

It is a job on the daemon's timing engine (dispatcher.runtime.timing), which decides when it
runs: when
woken (intake of a future job, a retry, a NOTIFY from another instance: `wake`), at the next due
time it computed after its last round, and at least every `interval_s`; so a job due now starts
within milliseconds and a missed wake-up costs at most one interval. A wake-up during a round
runs one more round after it.

Moving ahead (`ahead_s`, the setting `scan_ahead_s`): a round moves the jobs due within
`ahead_s` too, and wakes the workers when each falls due (a timer of the event loop, from the
move's own answer, so never early); the claims take no job before its due time. A burst of
10,000 due at one instant is then moved in the second before it, while nothing runs, instead of
by statements that share the database with its own claims. The daemon that moved a job wakes
its own loops at its due time, and, for `WAKE_OTHERS_FROM` jobs or more due at one instant,
every other daemon too (one NOTIFY), so a burst is shared as when each daemon's scan moved part
of it at the instant; another daemon finds a smaller one by its work poll should the mover stop
first.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from dispatcher.db.jobs import JobRepository
from dispatcher.observability import metrics
from dispatcher.runtime.lifecycle import Service
from dispatcher.runtime.timing import TimingEngine

log = logging.getLogger(__name__)

MIN_IDLE_WAIT_S = 0.005
FIRST_BATCH = 125
# jobs moved ahead that fall due at one instant, from which the other daemons are told then
WAKE_OTHERS_FROM = 100


class DueScanner(Service):
    name = "due-scan"

    def __init__(
        self,
        repo: JobRepository,
        timing: TimingEngine,
        *,
        batch: int,
        interval_s: float,
        on_ready: Callable[[], None],
        gone_owners: Callable[[], list[str]] = list,
        ahead_s: float = 0.0,
    ):
        self._repo = repo
        self._timing = timing
        self._batch = batch
        self._interval_s = interval_s
        self._on_ready = on_ready
        # daemons judged gone (engine/gone_owners.py): their running jobs are rescued now
        self._gone_owners = gone_owners
        self._ahead_s = ahead_s
        # the workers' wake-ups for jobs moved ahead, by the loop time (ms) they fall due, with
        # how many jobs fall due then
        self._due_wakes: dict[float, tuple[asyncio.TimerHandle, int]] = {}
        self._notices: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._timing.every(self.name, self._interval_s, self.scan, finish_on_stop=True)
        self.wake()  # the first round at once

    async def stop(self) -> None:
        await self._timing.cancel(self.name)
        for handle, _jobs in self._due_wakes.values():
            handle.cancel()
        self._due_wakes.clear()
        for task in list(self._notices):
            task.cancel()
        await asyncio.gather(*self._notices, return_exceptions=True)

    def wake(self) -> None:
        self._timing.run_now(self.name)

    def wake_in(self, seconds: float) -> None:
        """A round in time for a job that falls due in `seconds` (`ahead_s` before it)."""
        seconds -= self._ahead_s
        if seconds <= 0:
            self.wake()
        else:
            self._timing.run_by(self.name, datetime.now(UTC) + timedelta(seconds=seconds))

    async def run_once(self) -> int:
        """Move every due job (in batches) and rescue expired leases; return jobs made ready."""
        moved = 0
        await self._expire()
        # A small first batch, then growing ones: the workers start claiming once the first
        # commits. With 10,000 jobs due at one instant a first batch of 2,000 took 20-75 ms
        # (2 shared cores, load 3-8), one of 125 took 4-16 ms, and the first claim went out
        # 9-27 ms after the instant instead of 22-91 ms. Later batches move while the workers
        # claim.
        batch = min(FIRST_BATCH, self._batch)
        while True:
            done = await self._repo.scan_due(batch, self._ahead_s)
            n = done.moved
            moved += n
            if done.due_now:
                self._on_ready()  # let workers start on the first batch while we move the next
            for seconds, jobs in zip(done.due_in_s, done.due_counts, strict=True):
                self._wake_workers_in(seconds, jobs)
            if n < batch:
                break
            batch = min(batch * 4, self._batch)
        await self._rescue()
        metrics.SCAN_MOVED.inc(moved)
        return moved

    def _wake_workers_in(self, seconds: float, jobs: int) -> None:
        """The workers' wake-up when `jobs` moved ahead fall due (one per millisecond)."""
        loop = asyncio.get_running_loop()
        when = math.ceil((loop.time() + seconds) * 1000) / 1000  # up, never early
        if when in self._due_wakes:
            handle, before = self._due_wakes[when]
            self._due_wakes[when] = (handle, before + jobs)
        else:
            self._due_wakes[when] = (loop.call_at(when, self._due_now, when), jobs)

    def _due_now(self, when: float) -> None:
        _handle, jobs = self._due_wakes.pop(when, (None, 0))
        self._on_ready()
        if jobs >= WAKE_OTHERS_FROM:
            task = asyncio.create_task(self._wake_others(jobs))
            self._notices.add(task)
            task.add_done_callback(self._notices.discard)

    async def _wake_others(self, jobs: int) -> None:
        try:
            await self._repo.wake_ready()
        except Exception as exc:  # they find the jobs by their work poll
            log.warning("could not tell the other daemons of %d jobs due now: %s", jobs, exc)

    async def _expire(self) -> None:
        """End the scheduled and ready jobs whose time to live passed before they started, a
        batch at a time, before moving any (the move skips them too). One probe of an empty
        index when no job has a TTL."""
        while True:
            expired = await self._repo.expire_unstarted(self._batch)
            for queue, n in expired.items():
                metrics.DEAD_LETTERS.labels(queue, "expired").inc(n)
                metrics.JOBS_COMPLETED.labels(queue, "dead").inc(n)
                log.warning("%d jobs of queue %r expired before they started", n, queue)
            if sum(expired.values()) < self._batch:
                return

    async def _rescue(self) -> None:
        """Rescue expired leases and the running jobs of gone daemons, a batch at a time until
        a batch comes back short (a killed daemon may leave thousands), waking the workers
        after each batch that made jobs ready."""
        gone = self._gone_owners()
        while True:
            rescued = await self._repo.rescue(self._batch, gone)
            per_kind: dict[str, int] = {}
            for (why, state), n in rescued.items():
                per_kind[why] = per_kind.get(why, 0) + n
                if why == "owner_gone":
                    metrics.OWNER_GONE_RESCUED.labels(state).inc(n)
                    log.warning("rescued %d jobs of gone daemons %s -> %s", n, gone, state)
                else:
                    metrics.LEASES_RESCUED.labels(state).inc(n)
                    log.warning("rescued %d jobs with expired leases -> %s", n, state)
            if any(state == "ready" for _why, state in rescued):
                self._on_ready()
            if max(per_kind.values(), default=0) < self._batch:
                return

    async def scan(self) -> None:
        """One round (the engine's call): move what is due, then ask to run again at the next
        due time if that comes before the next interval."""
        try:
            moved = await self.run_once()
            next_due = await self._repo.seconds_to_next_due()
        except Exception as exc:  # the database may be restarting: try again next interval
            log.error("due-scan failed: %s", exc)
            return
        if next_due is None:
            return
        wait_s = max(next_due - self._ahead_s, 0.0)  # the next round moves it ahead
        if wait_s >= self._interval_s:
            return
        if not moved:  # due rows we could not take are locked by another instance: no spin
            wait_s = max(wait_s, MIN_IDLE_WAIT_S)
        self._timing.run_by(self.name, datetime.now(UTC) + timedelta(seconds=wait_s))
