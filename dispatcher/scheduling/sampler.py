"""Samples gauges from the database: jobs per state, oldest ready age, outbox lag, overdue.

State counts come from the database, not from memory, so every instance reports the same truth
and a restart does not reset them.
"""

from __future__ import annotations

import logging
import time

from dispatcher import metrics
from dispatcher.db.jobs import JobRepository
from dispatcher.model import STATES

log = logging.getLogger(__name__)

COUNT_COST_FACTOR = 20
# Above this many rows (planner estimate) the per-state gauges come from statistics
# (pg_stats frequencies, refreshed by autovacuum's ANALYZE): approximate, but free.
EXACT_COUNT_UP_TO = 1_000_000
ESTIMATE_INTERVAL_S = 30.0


class MetricsSampler:
    def __init__(self, repo: JobRepository, overdue_after_s: float):
        self._repo = repo
        self._overdue_after_s = overdue_after_s
        self._counts: list[tuple[str, str, int]] = []
        self._next_count_at = 0.0

    async def run_once(self) -> None:
        try:
            counts = await self._state_counts()
            ages = await self._repo.oldest_ready_age()
            overdue = await self._repo.count_overdue(self._overdue_after_s)
        except Exception as exc:
            log.warning("metric sampling failed: %s", exc)
            return
        seen: dict[tuple[str, str], int] = {(q, s): n for q, s, n in counts}
        for queue in {q for q, _ in seen} | set(ages) | set(overdue):
            for state in STATES:
                metrics.JOBS_BY_STATE.labels(queue, state).set(seen.get((queue, state), 0))
            metrics.READY_OLDEST_AGE.labels(queue).set(ages.get(queue, 0.0))
            metrics.OVERDUE.labels(queue).set(overdue.get(queue, 0))
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
