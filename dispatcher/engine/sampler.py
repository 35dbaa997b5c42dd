"""Samples gauges from the database: jobs per state, oldest ready age, outbox lag, overdue.

State counts come from the database, not from memory, so every instance reports the same truth
and a restart does not reset them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from dispatcher.db.jobs import JobRepository
from dispatcher.model import STATES
from dispatcher.observability import metrics

log = logging.getLogger(__name__)

COUNT_COST_FACTOR = 20
# Above this many rows (planner estimate) the per-state gauges come from statistics
# (pg_stats frequencies, refreshed by autovacuum's ANALYZE): approximate, but free.
EXACT_COUNT_UP_TO = 1_000_000
ESTIMATE_INTERVAL_S = 30.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the database: what the gauges and the queue overview (GET /v1/queues) show.
    `counts` may be older than the rest (see `MetricsSampler._state_counts`)."""

    counts: list[tuple[str, str, int]]
    ages: dict[str, float]
    overdue: dict[str, int]
    queues: list[dict[str, Any]]  # the queue registry: pause state, dead-letter notification
    taken_at: float  # time.monotonic()


class MetricsSampler:
    def __init__(self, repo: JobRepository, overdue_after_s: float):
        self._repo = repo
        self._overdue_after_s = overdue_after_s
        self._counts: list[tuple[str, str, int]] = []
        self._next_count_at = 0.0
        self._last: Sample | None = None
        self._lock = asyncio.Lock()

    async def sample(self, max_age_s: float = 0.0) -> Sample:
        """A sample at most `max_age_s` old; callers arriving together share one look, so any
        number of concurrent overview requests costs the database one sample per `max_age_s`."""
        async with self._lock:
            last = self._last
            if last is not None and time.monotonic() - last.taken_at <= max_age_s:
                return last
            self._last = Sample(
                await self._state_counts(),
                await self._repo.oldest_ready_age(),
                await self._repo.count_overdue(self._overdue_after_s),
                await self._repo.list_queues(),
                time.monotonic(),
            )
            return self._last

    def latest(self, max_age_s: float) -> Sample | None:
        """The last sample if at most `max_age_s` old, without waiting for one in progress (the
        console's pages: a sample can take a second with a large ready backlog)."""
        last = self._last
        if last is not None and time.monotonic() - last.taken_at <= max_age_s:
            return last
        return None

    def ready_ages(self, max_age_s: float) -> dict[str, float]:
        """The oldest ready job's age per queue from the last sample if at most `max_age_s`
        old, else nothing (the history recorder's gauge: a stale age is not written)."""
        last = self.latest(max_age_s)
        return dict(last.ages) if last is not None else {}

    async def run_once(self) -> None:
        try:
            sample = await self.sample()
        except Exception as exc:
            log.warning("metric sampling failed: %s", exc)
            return
        seen: dict[tuple[str, str], int] = {(q, s): n for q, s, n in sample.counts}
        ages, overdue = sample.ages, sample.overdue
        paused = {row["name"]: row["paused"] for row in sample.queues}
        for queue in {q for q, _ in seen} | set(ages) | set(overdue) | set(paused):
            for state in STATES:
                metrics.JOBS_BY_STATE.labels(queue, state).set(seen.get((queue, state), 0))
            metrics.READY_OLDEST_AGE.labels(queue).set(ages.get(queue, 0.0))
            metrics.OVERDUE.labels(queue).set(overdue.get(queue, 0))
            metrics.QUEUE_PAUSED.labels(queue).set(1 if paused.get(queue) else 0)
        metrics.OUTBOX_LAG.set(max(ages.values(), default=0.0))

    async def _state_counts(self) -> list[tuple[str, str, int]]:
        """Counting every job is a full scan: with millions of rows it takes seconds of
        database CPU. Re-count only after 20 times the last count's duration has passed, so
        sampling never takes more than ~5 % of a database core; other gauges stay fresh."""
        now = time.monotonic()
        if now >= self._next_count_at:
            total = await self._repo.estimated_jobs()
            if total > EXACT_COUNT_UP_TO:  # millions of rows: planner statistics, no scan
                estimate = await self._repo.estimate_by_state(total)
                if estimate:
                    self._counts = estimate
                    self._next_count_at = now + ESTIMATE_INTERVAL_S
                    return self._counts
            self._counts = await self._repo.counts_by_state()
            took = time.monotonic() - now
            self._next_count_at = now + COUNT_COST_FACTOR * took
        return self._counts
