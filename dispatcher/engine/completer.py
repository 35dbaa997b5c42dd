"""Batched completion: successful attempts are recorded many per statement.

Callers `await record(job, result, latency_s)`, or `record_many` for the attempts of a claim whose
effects finished at once (one future for all of them); a single writer task flushes everything
queued so far in one statement (the jobs' UPDATE and their attempt history rows), so batching
grows with load and costs nothing when idle (no timer, no added latency). The metrics of what it
wrote (effect durations, succeeded counts) are updated once per batch and queue too.

One job's outcome never fails the others' (invariant 10): the repository stores every result
and excerpt in its safe form (db/outcomes.py), and a batch the database still refuses for its
data is split until the one job it refuses is found and ended alone (`result_unstorable`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from dispatcher.db.jobs import JobRepository
from dispatcher.db.outcomes import is_data_error
from dispatcher.db.pool import is_unavailable
from dispatcher.effects.base import Delivered
from dispatcher.engine.tally import observe_many
from dispatcher.model import AttemptKey, Job
from dispatcher.observability import metrics
from dispatcher.runtime.lifecycle import Service

log = logging.getLogger(__name__)

MAX_BATCH = 2000  # rows per statement, except that a group from `record_many` is never split
# The dead reason of a job whose effect succeeded but whose outcome the database refused even in
# its safe form (db/outcomes.py): it ends alone, and the others of its batch are written.
UNSTORABLE = "result_unstorable"


class _Group:
    """Successes queued together, answered by one future: per attempt, whether its lease still
    held. Parallel lists, so a claim's worth costs three lists, not an object per attempt. The
    attempts of one queue (one claim's, or one attempt)."""

    __slots__ = ("future", "jobs", "latencies", "queue", "results")

    def __init__(
        self,
        jobs: list[Job],
        results: list[Any],
        latencies: list[float],
        future: asyncio.Future[list[bool]],
    ):
        self.jobs = jobs
        self.results = results
        self.latencies = latencies
        self.future = future
        self.queue = jobs[0].queue if jobs else ""


class _Rows:
    """A batch of completions as the write takes them (parallel lists), or a part of one;
    `offset` is the part's first index in the whole batch."""

    __slots__ = ("excerpts", "jobs", "latencies", "offset", "results", "statuses")

    def __init__(
        self,
        jobs: list[Job],
        results: list[Any],
        latencies: list[float],
        statuses: list[int | None] | None,
        excerpts: list[str | None] | None,
        offset: int = 0,
    ):
        self.jobs = jobs
        self.results = results
        self.latencies = latencies
        self.statuses = statuses
        self.excerpts = excerpts
        self.offset = offset

    def part(self, start: int, end: int) -> _Rows:
        return _Rows(
            self.jobs[start:end],
            self.results[start:end],
            self.latencies[start:end],
            None if self.statuses is None else self.statuses[start:end],
            None if self.excerpts is None else self.excerpts[start:end],
            self.offset + start,
        )


class Completer(Service):
    """Owns the write of `succeeded`. `record` returns True when this lease still held the job
    (fenced by owner and attempt: a stale attempt's success changes nothing)."""

    name = "completer"

    def __init__(self, repo: JobRepository, owner: str):
        self._repo = repo
        self._owner = owner
        self._pending: list[_Group] = []
        self._unwritten: Counter[str] = Counter()  # per queue: successes queued or being written
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()
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
        return self._unwritten.total()

    def unwritten(self, queue: str) -> int:
        """Successes of `queue` queued or being written: their jobs are still `running` in the
        database, whose count the claim's grant holds to the queue's `max_inflight`."""
        return self._unwritten[queue]

    async def wait_for_a_write(self) -> None:
        """Until the write in progress (or the next one) has ended."""
        self._flushed.clear()
        await self._flushed.wait()

    async def wait_backlog_at_most(self, limit: int) -> None:
        while self.backlog > limit and self._task is not None:
            await self.wait_for_a_write()

    def record(self, job: Job, result: Any, latency_s: float) -> asyncio.Future[list[bool]]:
        """Queue a success; `latency_s` (the effect's duration) goes to the attempt history,
        with the HTTP status and response excerpt when `result` is `Delivered`. The future
        answers `[held]`."""
        return self.record_many([job], [result], [latency_s])

    def record_many(
        self, jobs: list[Job], results: list[Any], latencies: list[float]
    ) -> asyncio.Future[list[bool]]:
        """Queue successes of one queue (parallel lists, taken over by the completer); the
        future answers, in order, whether each attempt's lease still held."""
        future: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
        group = _Group(jobs, results, latencies, future)
        self._pending.append(group)
        self._unwritten[group.queue] += len(jobs)
        self._wake.set()
        return future

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._take()
                try:
                    await self._flush(batch)
                finally:
                    for group in batch:
                        self._unwritten[group.queue] -= len(group.jobs)
                    self._flushed.set()
            if self._stopping:
                return

    def _take(self) -> list[_Group]:
        """Whole groups from the front of the queue, up to MAX_BATCH rows (at least one)."""
        taken, rows = 0, 0
        for group in self._pending:
            if taken and rows + len(group.jobs) > MAX_BATCH:
                break
            taken += 1
            rows += len(group.jobs)
        batch, self._pending = self._pending[:taken], self._pending[taken:]
        return batch

    async def _flush(self, batch: list[_Group]) -> None:
        if len(batch) == 1:  # a claim's worth of attempts that finished at once
            jobs, results, latencies = batch[0].jobs, batch[0].results, batch[0].latencies
        else:
            jobs = [j for g in batch for j in g.jobs]
            results = [r for g in batch for r in g.results]
            latencies = [t for g in batch for t in g.latencies]
        statuses, excerpts = _delivery_details(results)
        rows = _Rows(jobs, results, latencies, statuses, excerpts)
        unstorable: dict[int, bool] = {}  # index -> whether it was ended (its lease held)
        try:
            done = await self._write(rows, unstorable)
        except Exception as exc:  # the lease will expire and the job is retried: never lost
            log.error("could not record %d completions: %s", len(jobs), exc)
            for group in batch:
                if not group.future.done():
                    group.future.set_exception(exc)
            return
        held = [(j.id, j.attempt) in done for j in jobs]
        self._count(jobs, latencies, held)
        for index, ended in unstorable.items():
            held[index] = ended  # its outcome was recorded (dead), not lost
        start = 0
        for group in batch:
            end = start + len(group.jobs)
            if not group.future.done():
                group.future.set_result(held[start:end])
            start = end

    async def _write(self, rows: _Rows, unstorable: dict[int, bool]) -> set[AttemptKey]:
        """Write `rows` as succeeded; return the attempts whose lease held. A write the database
        refuses for its data (`is_data_error`: a value no safe form foresaw, a constraint) is
        split in halves, down to the job whose data it refuses, which is ended alone (added to
        `unstorable`): one job's outcome never fails the others'. Any other error (the database
        unreachable, a deadlock, a timeout) raises, as before: it is no one job's doing, and
        ending a job for it would end every job of the batch."""
        try:
            return await self._repo.complete(
                [j.id for j in rows.jobs],
                [j.attempt for j in rows.jobs],
                rows.results,
                self._owner,
                http_statuses=rows.statuses,
                latencies_s=rows.latencies,  # type: ignore[arg-type]  # list is invariant
                excerpts=rows.excerpts,
            )
        except Exception as exc:
            if is_unavailable(exc) or not is_data_error(exc):
                raise  # not one job's doing: the batch fails whole, retried after its leases
            if len(rows.jobs) > 1:
                half = len(rows.jobs) // 2
                first = await self._write(rows.part(0, half), unstorable)
                return first | await self._write(rows.part(half, len(rows.jobs)), unstorable)
            unstorable[rows.offset] = await self._end_unstorable(rows, exc)
            return set()

    async def _end_unstorable(self, rows: _Rows, exc: Exception) -> bool:
        """End the one job of `rows` as dead (`result_unstorable`): its effect ran, but the
        database refused its outcome even in its safe form. Returns whether its lease held."""
        job = rows.jobs[0]
        error = (
            f"the effect succeeded, but its outcome could not be stored "
            f"({type(exc).__name__}: {exc}); the result is dropped (a retry runs the effect again)"
        )
        try:
            outcome = await self._repo.record_failure(
                job,
                self._owner,
                permanent=True,
                delay_s=0.0,
                error=error,
                reason=UNSTORABLE,
                http_status=rows.statuses[0] if rows.statuses else None,
                latency_s=rows.latencies[0],
            )
        except Exception as failed:
            if is_unavailable(failed):
                raise
            # refused again: left to its lease, as before; the rest of the batch is written
            log.error(
                "could not end the job as %s either: %s", UNSTORABLE, failed, extra=job.log_fields
            )
            return False
        if outcome is None:
            return False
        metrics.DEAD_LETTERS.labels(job.queue, outcome[1] or UNSTORABLE).inc()
        metrics.JOBS_COMPLETED.labels(job.queue, "dead").inc()
        log.warning("dead letter (%s): %s", outcome[1], error[:500], extra=job.log_fields)
        return True

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
