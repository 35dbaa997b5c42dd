"""All queue workers of this process, and the drain: a soft stop, then a hard stop, then the
leases of what did not finish handed back."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from typing import Any

from dispatcher.db.jobs import JobRepository
from dispatcher.engine.queue_worker import QueueWorker
from dispatcher.model import AttemptKey
from dispatcher.runtime.lifecycle import Service

log = logging.getLogger(__name__)

_heap_frozen = False  # see WorkerPool.start


class LeasesNotReleased(Exception):
    """The drain could not hand unfinished jobs back; they wait for their leases to expire."""


class WorkerPool(Service):
    """All queue workers of this process. Stopping it is the drain: stop claiming at once, let
    running attempts finish for up to `drain_timeout_s` (the soft stop, cut short by `force`),
    cancel the rest and wait for them for up to `hard_stop_timeout_s` (the hard stop), then hand
    back the leases of every attempt that did not record its outcome. If that hand-back cannot
    be written, `stop()` raises `LeasesNotReleased` and the daemon exits non-zero."""

    name = "workers"

    def __init__(
        self,
        workers: list[QueueWorker],
        repo: JobRepository,
        owner: str,
        *,
        drain_timeout_s: float,
        hard_stop_timeout_s: float,
        force: asyncio.Event,
    ):
        self.workers = {w.queue: w for w in workers}
        self._repo = repo
        self._owner = owner
        self._drain_timeout_s = drain_timeout_s
        self._hard_stop_timeout_s = hard_stop_timeout_s
        self._force = force
        self._stopped = False
        # soft + hard + the hand-back, itself bounded by the hard deadline
        self.stop_timeout_s = drain_timeout_s + 2 * hard_stop_timeout_s + 1

    def supervise(self, on_died: Any) -> None:
        for worker in self.workers.values():
            worker.supervise(on_died)

    async def start(self) -> None:
        # What the daemon built to start (modules, configuration, pools, the app) lives as long
        # as it does: keep it out of the collector's full passes. The claim -> completion loop
        # allocates thousands of short-lived objects per batch, so full passes come often, and
        # each walked every object of the process: 20-25 % of the daemon's CPU on a drain of
        # no-op jobs (py-spy --native, 2026-12-01), gone once frozen. Once per process: what a
        # later pool (tests start many) leaves behind must stay collectable.
        global _heap_frozen
        if not _heap_frozen:
            _heap_frozen = True
            gc.collect()
            gc.freeze()
        for worker in self.workers.values():
            await worker.start()

    def wake(self) -> None:
        for worker in self.workers.values():
            worker.wake()

    def wake_queue(self, queue: str) -> None:
        """Wake `queue`'s loop; a queue this daemon does not run: nothing."""
        worker = self.workers.get(queue)
        if worker is not None:
            worker.wake()

    def running_attempts(self) -> list[AttemptKey]:
        return [key for w in self.workers.values() for key in w.running]

    def inflight(self) -> int:
        return sum(len(w.running) for w in self.workers.values())

    async def stop_claiming(self) -> None:
        await asyncio.gather(*(w.stop_claiming() for w in self.workers.values()))

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.stop_claiming()
        cancelled = await self._drain()
        unsettled = {*cancelled, *(k for w in self.workers.values() for k in w.unsettled)}
        try:
            if unsettled:
                await self._release(sorted(unsettled))
        finally:
            await asyncio.gather(*(w.settle() for w in self.workers.values()))

    async def _drain(self) -> list[AttemptKey]:
        """Soft stop, then hard stop; returns the attempts that were cancelled."""
        running = self.inflight()
        if not running:
            return []
        log.info("waiting up to %.0f s for %d running attempts", self._drain_timeout_s, running)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._drain_timeout_s):
                await asyncio.gather(*(w.wait_idle(self._force) for w in self.workers.values()))
        cancelled: list[AttemptKey] = []
        if self.inflight():
            log.warning("cancelling %d attempts still running", self.inflight())
            try:
                async with asyncio.timeout(self._hard_stop_timeout_s):
                    for worker in self.workers.values():
                        cancelled += await worker.cancel_running()
            except TimeoutError:
                log.error(
                    "attempts ignored cancellation for %.0f s; leaving them",
                    self._hard_stop_timeout_s,
                )
                cancelled = self.running_attempts()
        return cancelled

    async def _release(self, attempts: list[AttemptKey]) -> None:
        try:
            async with asyncio.timeout(self._hard_stop_timeout_s):
                released = await self._repo.release_leases(attempts, self._owner)
        except Exception as exc:
            raise LeasesNotReleased(
                f"could not hand {len(attempts)} unfinished jobs back ({type(exc).__name__}: "
                f"{exc}); they stay leased until their leases expire, then any instance "
                "retries them"
            ) from None
        if released:
            log.warning("released %d unfinished jobs back to ready", released)
