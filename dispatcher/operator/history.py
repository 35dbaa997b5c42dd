"""The history as GET /v1/history and the console's charts read it: a range (15 minutes, 24
hours, 7 days) cut into steps so that each range has a readable number of points, each step
with its counts and the due-to-start latency percentiles read back from the summed buckets.

The steps are aligned to whole multiples of the step (a 15-minute step starts at :00, :15, ...),
so two reads a few seconds apart put the same minutes in the same step, and every step of the
range is present (zeros where nothing happened), the current one last."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatcher.db.history import ALL_QUEUES, Counts, HistoryStore, Step
from dispatcher.observability.metrics import LATENCY_BUCKETS


@dataclass(frozen=True, slots=True)
class Range:
    """A range of history: its name, its span and its step."""

    name: str
    span_s: int
    step_s: int
    label: str

    @property
    def points(self) -> int:
        return self.span_s // self.step_s


# 15 points of a minute, 96 of 15 minutes, 84 of 2 hours.
RANGES = {
    r.name: r
    for r in (
        Range("15m", 15 * 60, 60, "15 minutes"),
        Range("24h", 24 * 3600, 15 * 60, "24 hours"),
        Range("7d", 7 * 86400, 2 * 3600, "7 days"),
    )
}
DEFAULT_RANGE = "15m"


class HistoryRequestError(ValueError):
    """A history request that names no known range or a malformed queue (the API answers 400)."""


def parse_range(raw: str | None) -> Range:
    if raw is None or raw == "":
        return RANGES[DEFAULT_RANGE]
    found = RANGES.get(raw)
    if found is None:
        raise HistoryRequestError(f"range must be one of {', '.join(RANGES)} (not {raw[:32]!r})")
    return found


def parse_queue(raw: str | None) -> str:
    """A queue name, or `*` (also for none given): every queue together."""
    if raw is None or raw == "" or raw == ALL_QUEUES:
        return ALL_QUEUES
    if len(raw) > 200 or not raw.isprintable():
        raise HistoryRequestError("queue must be a queue's name (printable, at most 200 chars)")
    return raw


def percentile_s(latency: tuple[int, ...], fraction: float) -> float | None:
    """The upper bound of the latency bucket holding the `fraction` quantile (None without any
    start); past the last bound, the last bound stands (the value is at least that)."""
    total = sum(latency)
    if total <= 0:
        return None
    want, seen = fraction * total, 0
    for i, n in enumerate(latency):
        seen += n
        if seen >= want:
            return float(LATENCY_BUCKETS[min(i, len(LATENCY_BUCKETS) - 1)])
    return float(LATENCY_BUCKETS[-1])


def start_of(r: Range, now: datetime) -> datetime:
    """The first step of range `r` ending with the step that holds `now`."""
    epoch = math.floor(now.timestamp() / r.step_s) * r.step_s
    return datetime.fromtimestamp(epoch, UTC) - timedelta(seconds=r.span_s - r.step_s)


def point(at: datetime, c: Counts) -> dict[str, Any]:
    p50, p95 = percentile_s(c.latency, 0.5), percentile_s(c.latency, 0.95)
    return {
        "at": at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "started": c.started,
        "succeeded": c.succeeded,
        "retried": c.retried,
        "dead": c.dead,
        "p50_ms": None if p50 is None else round(p50 * 1000, 3),
        "p95_ms": None if p95 is None else round(p95 * 1000, 3),
        "oldest_ready_s": None if c.oldest_ready_s is None else round(c.oldest_ready_s, 3),
    }


async def read_history(
    store: HistoryStore, queue: str, r: Range, now: datetime | None = None
) -> dict[str, Any]:
    """GET /v1/history's answer: every step of the range, oldest first."""
    now = now or datetime.now(UTC)
    since = start_of(r, now)
    until = since + timedelta(seconds=r.span_s)
    steps: dict[datetime, Step] = {s.at: s for s in await store.read(queue, since, until, r.step_s)}
    points = []
    for i in range(r.points):
        at = since + timedelta(seconds=i * r.step_s)
        step = steps.get(at)
        points.append(point(at, step.counts if step else Counts()))
    return {"queue": queue, "range": r.name, "step_s": r.step_s, "points": points}
