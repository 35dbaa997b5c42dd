"""The worker pool: per queue, a claim loop bounded by a token bucket and an in-flight cap.

The loop reserves start tokens and in-flight slots first, then claims at most that many jobs in
one statement (relay and claim fused for the in-process transport), so it never holds more work
than it can start at once and never leases a job it cannot run now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from dispatcher import metrics
from dispatcher.config import QueueSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.model import Job
from dispatcher.relay.transport import Transport
from dispatcher.work.deadlines import Member, SharedDeadline
from dispatcher.work.executor import Executor
from dispatcher.work.limiter import InflightLimit, TokenBucket

log = logging.getLogger(__name__)

CLAIM_ERROR_BACKOFF_S = 1.0


class QueueWorker:
    """Claims and runs the jobs of one queue. `stop_claiming` stops new starts at once."""

    def __init__(
        self,
        queue: str,
        settings: QueueSettings,
        transport: Transport,
        executor: Executor,
        *,
        idle_poll_s: float,
        bucket: TokenBucket | None = None,
    ):
        self.queue = queue
        self.settings = settings
        self.bucket = bucket or TokenBucket(settings.rate_per_s, settings.burst)
        self.inflight = InflightLimit(settings.max_inflight)
        self.running: dict[int, asyncio.Task[None]] = {}
        self._transport = transport
        self._executor = executor
        self._idle_poll_s = idle_poll_s
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._m_due_to_start = metrics.DUE_TO_START.labels(queue)
        self._m_inflight = metrics.INFLIGHT.labels(queue)
        self._m_duplicates = metrics.DUPLICATE_DELIVERIES.labels(queue)
        self._m_limiter_wait = metrics.LIMITER_WAIT.labels(queue)

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._claim_loop(), name=f"claim:{self.queue}")

    def wake(self) -> None:
        self._wake.set()

    async def stop_claiming(self) -> None:
        """Stop starting new jobs; running ones go on. Idempotent."""
        self._stopping.set()
        self._wake.set()
        self.inflight.release(0)  # unblock a loop waiting for a free slot
        if self._loop_task is not None:
            task, self._loop_task = self._loop_task, None
            await task

    async def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            await self.inflight.wait_for_free_slot_or(self._stopping)
            await self._executor.completion_backpressure(self.inflight.limit)
            if self._stopping.is_set():
                return
            wanted = min(self.settings.claim_batch, self.inflight.limit - self.inflight.used)
            tokens = self.bucket.take_up_to(wanted)
            if tokens == 0:
                wait_s = self.bucket.seconds_until_available()
                self._m_limiter_wait.inc(wait_s)
                await self._pause(wait_s, wake_on_signal=False)
                continue
            slots = self.inflight.reserve_up_to(tokens)
            self._wake.clear()
            try:
                jobs, taken = await self._transport.receive(self.queue, slots)
            except Exception as exc:
                log.error("claim failed on queue %s: %s", self.queue, exc)
                jobs, taken = [], 0
                self._return_unused(slots, tokens, 0)
                await self._pause(CLAIM_ERROR_BACKOFF_S, wake_on_signal=False)
                continue
            self._return_unused(slots, tokens, len(jobs))
            if taken > len(jobs):
                self._m_duplicates.inc(taken - len(jobs))
            deadlines: dict[str, SharedDeadline | None] = {}
            for job in jobs:
                if job.handler not in deadlines:
                    timeout_s = self._executor.timeout_s(job.handler)
                    deadlines[job.handler] = (
                        SharedDeadline(timeout_s, self._timed_out) if timeout_s else None
                    )
                self._start(job, deadlines[job.handler])
            if not jobs and taken == 0:
                await self._pause(self._idle_poll_s, wake_on_signal=True)

    def _return_unused(self, slots: int, tokens: int, used: int) -> None:
        if slots > used:
            self.inflight.release(slots - used)
        if tokens > used:
            self.bucket.give_back(tokens - used)

    def _start(self, job: Job, deadline: SharedDeadline | None) -> None:
        self._m_due_to_start.observe(max(0.0, job.due_to_start_s))
        self._m_inflight.inc()
        attempt = _Attempt(job.id, self.inflight, self._m_inflight, deadline)
        task = asyncio.create_task(self._executor.execute(job, attempt))
        self.running[job.id] = task
        task.add_done_callback(lambda _t: self._finished(attempt))

    def _finished(self, attempt: _Attempt) -> None:
        self.running.pop(attempt.job_id, None)
        attempt.effect_ended()  # no-op unless the task ended before its effect did (cancelled)

    def _timed_out(self, attempt: Member) -> None:
        task = self.running.get(attempt.job_id)
        if task is not None:
            task.cancel()

    async def _pause(self, seconds: float, *, wake_on_signal: bool) -> None:
        waiters = [self._stopping.wait()]
        if wake_on_signal:
            waiters.append(self._wake.wait())
        tasks = [asyncio.ensure_future(w) for w in waiters]
        try:
            await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()

    async def wait_idle(self, timeout_s: float, abort: asyncio.Event) -> None:
        """Wait until nothing runs, at most `timeout_s` seconds or until `abort` is set."""
        if not self.running:
            return
        aborted = asyncio.ensure_future(abort.wait())
        try:
            await asyncio.wait(
                [*self.running.values(), aborted],
                timeout=timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            while self.running and not abort.is_set():
                await asyncio.wait(
                    [*self.running.values(), aborted],
                    timeout=timeout_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            aborted.cancel()

    async def cancel_running(self) -> list[int]:
        """Cancel attempts still running; return their job ids (their leases must be released)."""
        ids = list(self.running)
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return ids


class _Attempt:
    """One job's attempt as the pool sees it. Its in-flight slot is released exactly once, when
    the effect ends (the completion write that follows runs outside the cap; the completer
    applies its own backpressure), and it leaves its shared deadline at the same moment."""

    __slots__ = ("_deadline", "_gauge", "_limit", "_released", "job_id", "timed_out")

    def __init__(
        self, job_id: int, limit: InflightLimit, gauge: Any, deadline: SharedDeadline | None
    ):
        self.job_id = job_id
        self.timed_out = False
        self._limit = limit
        self._gauge = gauge
        self._deadline = deadline
        self._released = False
        if deadline is not None:
            deadline.join(self)

    def effect_ended(self) -> None:
        if not self._released:
            self._released = True
            self._limit.release()
            self._gauge.dec()
            if self._deadline is not None:
                self._deadline.leave(self)


class WorkerPool:
    """All queue workers of this process plus the heartbeat that keeps their leases alive."""

    def __init__(self, workers: list[QueueWorker], repo: JobRepository, owner: str, lease_s: float):
        self.workers = {w.queue: w for w in workers}
        self._repo = repo
        self._owner = owner
        self._lease_s = lease_s
        self._heartbeat_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for worker in self.workers.values():
            await worker.start()
        self._heartbeat_task = asyncio.create_task(self._heartbeat(), name="lease-heartbeat")

    def wake(self) -> None:
        for worker in self.workers.values():
            worker.wake()

    def running_ids(self) -> list[int]:
        return [job_id for w in self.workers.values() for job_id in w.running]

    def inflight(self) -> int:
        return sum(len(w.running) for w in self.workers.values())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._lease_s / 3)
            ids = self.running_ids()
            if not ids:
                continue
            try:
                await self._repo.extend_leases(ids, self._owner, self._lease_s)
            except Exception as exc:  # next beat retries; the lease has two more beats of slack
                log.error("could not extend %d leases: %s", len(ids), exc)

    async def stop_claiming(self) -> None:
        await asyncio.gather(*(w.stop_claiming() for w in self.workers.values()))

    async def drain(self, timeout_s: float, abort: asyncio.Event) -> list[int]:
        """Wait for running attempts up to `timeout_s` (or until `abort`), cancel the rest;
        return the ids of the cancelled ones (their leases must be released)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(
                    *(w.wait_idle(timeout_s, abort) for w in self.workers.values())
                )
        unfinished: list[int] = []
        for worker in self.workers.values():
            unfinished += await worker.cancel_running()
        return unfinished

    async def stop(self) -> None:
        await self.stop_claiming()
        if self._heartbeat_task is not None:
            task, self._heartbeat_task = self._heartbeat_task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
