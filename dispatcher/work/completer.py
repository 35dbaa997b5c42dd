"""Batched completion: successful attempts are recorded many per statement.

Callers `await record(job, result, latency_s)`; a single writer task flushes everything queued so
far in one statement (the jobs' UPDATE and their attempt history rows), so batching grows with
load and costs nothing when idle (no timer, no added latency). The metrics of what it wrote
(effect durations, succeeded counts) are updated once per batch and queue too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from dispatcher import metrics
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.base import Delivered
from dispatcher.lifecycle import Service
from dispatcher.model import Job
from dispatcher.work.tally import observe_many

log = logging.getLogger(__name__)

MAX_BATCH = 2000


class Completer(Service):
    """Owns the write of `succeeded`. `record` returns True when this lease still held the job
    (fenced by owner and attempt: a stale attempt's success changes nothing)."""

    name = "completer"

    def __init__(self, repo: JobRepository, owner: str):
        self._repo = repo
        self._owner = owner
        self._pending: list[tuple[Job, Any, float, asyncio.Future[bool]]] = []
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()
        self._writing = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._children: dict[str, tuple[Any, Any]] = {}  # queue -> (duration, succeeded)

    async def start(self) -> None:
        self._task = self.spawn(self._run())

    async def stop(self) -> None:
        """Flush what is queued, then stop. Idempotent."""
        if self._task is None:
            return
        self._stopping = True  # also tells the supervisor that the task may now end
        self._wake.set()
        task, self._task = self._task, None
        await task

    @property
    def backlog(self) -> int:
        """Completions queued or being written."""
        return len(self._pending) + self._writing

    async def wait_backlog_at_most(self, limit: int) -> None:
        while self.backlog > limit and self._task is not None:
            self._flushed.clear()
            await self._flushed.wait()

    def record(self, job: Job, result: Any, latency_s: float) -> asyncio.Future[bool]:
        """Queue a success; `latency_s` (the effect's duration) goes to the attempt history,
        with the HTTP status and response excerpt when `result` is `Delivered`."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((job, result, latency_s, future))
        self._wake.set()
        return future

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                self._writing = len(batch)
                try:
                    await self._flush(batch)
                finally:
                    self._writing = 0
                    self._flushed.set()
            if self._stopping:
                return

    async def _flush(self, batch: list[tuple[Job, Any, float, asyncio.Future[bool]]]) -> None:
        jobs: list[Job] = [b[0] for b in batch]
        results: list[Any] = [b[1] for b in batch]
        latencies: list[float] = [b[2] for b in batch]
        statuses, excerpts = _delivery_details(results)
        try:
            done = await self._repo.complete(
                [j.id for j in jobs],
                [j.attempt for j in jobs],
                results,
                self._owner,
                http_statuses=statuses,
                latencies_s=latencies,  # type: ignore[arg-type]  # list is invariant
                excerpts=excerpts,
            )
        except Exception as exc:  # the lease will expire and the job is retried: never lost
            log.error("could not record %d completions: %s", len(batch), exc)
            for _, _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        held = [(j.id, j.attempt) in done for j in jobs]
        self._count(jobs, latencies, held)
        for (_, _, _, future), still_held in zip(batch, held, strict=True):
            if not future.done():
                future.set_result(still_held)

    def _count(self, jobs: list[Job], latencies: list[float], held: list[bool]) -> None:
        """Effect durations (every attempt written) and succeeded counts (those whose lease
        still held), per queue, one update each per batch."""
        queues = {j.queue for j in jobs}
        for queue in queues:
            children = self._children.get(queue)
            if children is None:
                children = self._children[queue] = (
                    metrics.EFFECT_DURATION.labels(queue),
                    metrics.JOBS_COMPLETED.labels(queue, "succeeded"),
                )
            duration, succeeded = children
            if len(queues) == 1:
                observe_many(duration, latencies)
                succeeded.inc(sum(held))
            else:
                mine = [i for i, j in enumerate(jobs) if j.queue == queue]
                observe_many(duration, [latencies[i] for i in mine])
                succeeded.inc(sum(held[i] for i in mine))


def _delivery_details(
    results: list[Any],
) -> tuple[list[int | None] | None, list[str | None] | None]:
    """HTTP statuses and response excerpts of a batch, parallel to it; (None, None) when no
    result carries them (every non-http batch), which the statement reads as all NULL."""
    if not any(type(r) is Delivered for r in results):
        return None, None
    statuses: list[int | None] = []
    excerpts: list[str | None] = []
    for r in results:
        delivered = type(r) is Delivered
        statuses.append(r.http_status if delivered else None)
        excerpts.append(r.excerpt if delivered else None)
    return statuses, excerpts
