"""The history recorder: every few seconds, this daemon's counts since its last flush are added
to the database's per-minute history (dispatcher.db.history), where every daemon's counts sum to
the cluster's.

Nothing is added to the hot path: the counts are the differences between two readings of the
metrics the engine keeps anyway (attempts started and their due-to-start latency from the
`dispatcher_due_to_start_seconds` histogram, outcomes from `dispatcher_jobs_completed_total`,
retries from `dispatcher_retries_total`), and the oldest-ready age is the metrics sampler's. A
flush is one statement; a flush that fails keeps its counts for the next one (the reading it
was taken from is not adopted), so an outage loses nothing and a killed daemon at most one
interval. `stop()` flushes once more, so a daemon stopped on purpose loses nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from dispatcher.db.history import ALL_QUEUES, Counts, HistoryStore
from dispatcher.observability import metrics

log = logging.getLogger(__name__)

# Every 5 s: a killed daemon's history misses at most this long of its work, and three daemons
# write 3 x (queues + 1) rows per 5 s at most (bench_engine, with and without: CHANGELOG).
FLUSH_INTERVAL_S = 5.0


@dataclass(slots=True)
class Reading:
    """Cumulative metric readings of one queue since the process started."""

    started: float = 0.0
    succeeded: float = 0.0
    retried: float = 0.0
    dead: float = 0.0
    buckets: list[float] = field(default_factory=list)  # cumulative, one per bound and +Inf


def read_metrics() -> dict[str, Reading]:
    """This process's cumulative counts per queue, from the metric registry."""
    found: dict[str, Reading] = {}
    for family in metrics.DUE_TO_START.collect():
        for sample in family.samples:
            entry = found.setdefault(sample.labels["queue"], Reading())
            if sample.name.endswith("_count"):
                entry.started = sample.value
            elif sample.name.endswith("_bucket"):
                entry.buckets.append(sample.value)  # the client lists bounds in ascending order
    for family in metrics.JOBS_COMPLETED.collect():
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            outcome = sample.labels["outcome"]
            if outcome in ("succeeded", "dead"):
                entry = found.setdefault(sample.labels["queue"], Reading())
                setattr(entry, outcome, getattr(entry, outcome) + sample.value)
    for family in metrics.RETRIES.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                entry = found.setdefault(sample.labels["queue"], Reading())
                entry.retried += sample.value
    return found


def difference(now: Reading, before: Reading | None) -> Counts:
    """The counts between two readings of one queue; latency per bucket (not cumulative)."""
    before = before or Reading()
    cumulative = [
        round(b - (before.buckets[i] if i < len(before.buckets) else 0.0))
        for i, b in enumerate(now.buckets)
    ]
    per_bucket = [c - (cumulative[i - 1] if i else 0) for i, c in enumerate(cumulative)]
    return Counts(
        started=round(now.started - before.started),
        succeeded=round(now.succeeded - before.succeeded),
        retried=round(now.retried - before.retried),
        dead=round(now.dead - before.dead),
        latency=tuple(per_bucket) if any(per_bucket) else (),
    )


def with_total(counts: dict[str, Counts]) -> dict[str, Counts]:
    """`counts` and the row of all queues together: sums, and the largest oldest-ready age."""
    width = max((len(c.latency) for c in counts.values()), default=0)
    latency = [0] * width
    for c in counts.values():
        for i, n in enumerate(c.latency):
            latency[i] += n
    ages = [c.oldest_ready_s for c in counts.values() if c.oldest_ready_s is not None]
    total = Counts(
        started=sum(c.started for c in counts.values()),
        succeeded=sum(c.succeeded for c in counts.values()),
        retried=sum(c.retried for c in counts.values()),
        dead=sum(c.dead for c in counts.values()),
        latency=tuple(latency) if any(latency) else (),
        oldest_ready_s=max(ages) if ages else None,
    )
    return {**counts, ALL_QUEUES: total}


class HistoryRecorder:
    """Adds this daemon's counts to the history every `FLUSH_INTERVAL_S` (`run_once`, on the
    timing engine) and once more at `stop()`. `oldest_ready` gives the latest sampled age of
    each queue's oldest ready job (empty when there is no fresh sample). Only the event loop
    touches it; `run_once` and `stop` never overlap (the timing engine stops first)."""

    def __init__(
        self,
        store: HistoryStore,
        oldest_ready: Callable[[], dict[str, float]],
        read: Callable[[], dict[str, Reading]] = read_metrics,
    ):
        self._store = store
        self._oldest_ready = oldest_ready
        self._read = read
        self._last: dict[str, Reading] = {}

    async def start(self) -> None:
        self._last = self._read()  # this process's counts so far are not this run's to add

    async def stop(self) -> None:
        try:
            await self.run_once()
        except Exception as exc:  # stopping goes on: the history misses one interval
            log.warning("the last history flush failed: %s", exc)

    async def run_once(self) -> None:
        """Add the counts since the last successful flush."""
        reading = self._read()
        counts = {q: difference(r, self._last.get(q)) for q, r in reading.items()}
        for queue, age in self._oldest_ready().items():
            if age > 0:
                c = counts.get(queue, Counts())
                counts[queue] = Counts(
                    c.started, c.succeeded, c.retried, c.dead, c.latency, float(age)
                )
        counts = {q: c for q, c in counts.items() if not c.is_empty()}
        if counts:
            await self._store.add(with_total(counts))
        self._last = reading
