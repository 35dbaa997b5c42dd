"""The console's live chart data: starts and due-to-start latency of this daemon, one point per
second over the last 15 minutes, in a bounded ring.

The numbers are the daemon's own: each tick reads the `dispatcher_due_to_start_seconds`
histogram (observed once per started attempt by the worker pool) and keeps the difference from
the previous tick. Nothing is added to the hot path, and the ring holds at most `window_s /
interval_s` points whatever the load (900 small tuples: a few hundred kilobytes at most).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.observability import metrics

WINDOW_S = 900.0
INTERVAL_S = 1.0
# The overview's starts/s of a queue: the average over this many most recent seconds.
RATE_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class Totals:
    """Cumulative histogram readings of one queue: count, sum and the count per bucket bound."""

    count: float
    total_s: float
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending


@dataclass(frozen=True, slots=True)
class Point:
    """One interval: starts per queue, and the due-to-start latency of all of them."""

    at: float  # wall clock (Unix seconds) at the end of the interval
    seconds: float  # the interval's length
    starts: dict[str, int]
    mean_s: float | None  # None when nothing started
    p95_s: float | None  # upper bound of the histogram bucket holding the 95th percentile

    @property
    def total(self) -> int:
        return sum(self.starts.values())


def read_due_to_start() -> dict[str, Totals]:
    """The histogram's cumulative readings per queue label."""
    found: dict[str, dict[str, object]] = {}
    for family in metrics.DUE_TO_START.collect():
        for sample in family.samples:
            queue = sample.labels.get("queue", "")
            entry = found.setdefault(queue, {"count": 0.0, "sum": 0.0, "buckets": []})
            if sample.name.endswith("_count"):
                entry["count"] = sample.value
            elif sample.name.endswith("_sum"):
                entry["sum"] = sample.value
            elif sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                entry["buckets"].append((bound, sample.value))  # type: ignore[attr-defined]
    return {
        queue: Totals(
            float(e["count"]),  # type: ignore[arg-type]
            float(e["sum"]),  # type: ignore[arg-type]
            tuple(sorted(e["buckets"])),  # type: ignore[call-overload]
        )
        for queue, e in found.items()
    }


def percentile_bound(deltas: list[tuple[float, float]], fraction: float) -> float | None:
    """The upper bound of the bucket holding the `fraction` quantile, from cumulative bucket
    deltas (bound, count up to it); the largest finite bound stands in for +Inf."""
    if not deltas or deltas[-1][1] <= 0:
        return None
    want = fraction * deltas[-1][1]
    finite = [bound for bound, _ in deltas if math.isfinite(bound)]
    for bound, cumulative in deltas:
        if cumulative >= want:
            return bound if math.isfinite(bound) else (finite[-1] if finite else None)
    return None


class StartSeries:
    """The ring. `run_once` is a ticker's job (every `interval_s`); the console reads `points`
    and `starts_per_s`. Only the event loop touches it, so it needs no lock."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        interval_s: float = INTERVAL_S,
        read: Callable[[], dict[str, Totals]] = read_due_to_start,
        clock: Callable[[], float] = time.time,
    ):
        self.interval_s = interval_s
        self.window_s = window_s
        self._read = read
        self._clock = clock
        self._points: deque[Point] = deque(maxlen=max(1, int(window_s / interval_s)))
        self._last: dict[str, Totals] | None = None
        self._last_at = 0.0

    async def run_once(self) -> None:
        self.sample()

    def sample(self) -> Point | None:
        """Read the histogram and append the difference from the previous reading."""
        now, totals = self._clock(), self._read()
        last, last_at = self._last, self._last_at
        self._last, self._last_at = totals, now
        if last is None:
            return None  # the first reading is the baseline
        starts: dict[str, int] = {}
        latency = 0.0
        merged: dict[float, float] = {}
        for queue, current in totals.items():
            before = last.get(queue, Totals(0.0, 0.0, ()))
            n = round(current.count - before.count)
            if n <= 0:
                continue
            starts[queue] = n
            latency += current.total_s - before.total_s
            previous = dict(before.buckets)
            for bound, cumulative in current.buckets:
                merged[bound] = merged.get(bound, 0.0) + cumulative - previous.get(bound, 0.0)
        count = sum(starts.values())
        point = Point(
            at=now,
            seconds=max(now - last_at, 1e-6),
            starts=starts,
            mean_s=latency / count if count else None,
            p95_s=percentile_bound(sorted(merged.items()), 0.95) if count else None,
        )
        self._points.append(point)
        return point

    def points(self) -> list[Point]:
        """The points of the last `window_s`, oldest first."""
        since = self._clock() - self.window_s
        return [p for p in self._points if p.at >= since]

    def starts_per_s(self, queue: str, window_s: float = RATE_WINDOW_S) -> float:
        """Starts per second of `queue` over the last `window_s` (0 before any point)."""
        since = self._clock() - window_s
        recent = [p for p in self._points if p.at > since]
        seconds = sum(p.seconds for p in recent)
        if seconds <= 0:
            return 0.0
        return sum(p.starts.get(queue, 0) for p in recent) / seconds
