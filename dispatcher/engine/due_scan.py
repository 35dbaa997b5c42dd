"""The due-scan: moves due jobs to ready (with their outbox rows) and rescues expired leases,
and the running jobs of daemons judged gone (docs/recovery.md).

It is a job on the daemon's timing engine (dispatcher.runtime.timing), which decides when it
runs: when
woken (intake of a future job, a retry, a NOTIFY from another instance: `wake`), at the next due
time it computed after its last round, and at least every `interval_s`; so a job due now starts
within milliseconds and a missed wake-up costs at most one interval. A wake-up during a round
runs one more round after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from dispatcher.db.jobs import JobRepository
from dispatcher.observability import metrics
from dispatcher.runtime.lifecycle import Service
from dispatcher.runtime.timing import TimingEngine

log = logging.getLogger(__name__)

MIN_IDLE_WAIT_S = 0.005
FIRST_BATCH = 125


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
    ):
        self._repo = repo
        self._timing = timing
        self._batch = batch
        self._interval_s = interval_s
        self._on_ready = on_ready
        # daemons judged gone (engine/gone_owners.py): their running jobs are rescued now
        self._gone_owners = gone_owners

    async def start(self) -> None:
        self._timing.every(self.name, self._interval_s, self.scan, finish_on_stop=True)
        self.wake()  # the first round at once

    async def stop(self) -> None:
        await self._timing.cancel(self.name)

    def wake(self) -> None:
        self._timing.run_now(self.name)

    def wake_in(self, seconds: float) -> None:
        """A round no later than `seconds` from now (a job falls due then)."""
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
            n = await self._repo.scan_due(batch)
            moved += n
            if n:
                self._on_ready()  # let workers start on the first batch while we move the next
            if n < batch:
                break
            batch = min(batch * 4, self._batch)
        await self._rescue()
        metrics.SCAN_MOVED.inc(moved)
        return moved

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
        if next_due is None or next_due >= self._interval_s:
            return
        if not moved:  # due rows we could not take are locked by another instance: no spin
            next_due = max(next_due, MIN_IDLE_WAIT_S)
        self._timing.run_by(self.name, datetime.now(UTC) + timedelta(seconds=next_due))
