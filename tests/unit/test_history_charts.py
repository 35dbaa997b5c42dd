"""The history's pure parts: percentiles read back from bucket counts, the steps of each range,
a reading's differences, and the SVG the console draws (axes, legend, one hover title per step,
text escaped)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.console.charts import counts_chart, latency_chart, nice_ceiling
from dispatcher.db.history import ALL_QUEUES, Counts
from dispatcher.engine.history import Reading, difference, with_total
from dispatcher.observability.metrics import LATENCY_BUCKETS
from dispatcher.operator.history import (
    RANGES,
    HistoryRequestError,
    parse_queue,
    parse_range,
    percentile_s,
    point,
    start_of,
)

NOW = datetime(2026, 12, 1, 12, 7, 30, tzinfo=UTC)


def test_percentiles_are_bucket_bounds() -> None:
    assert percentile_s((), 0.5) is None and percentile_s((0, 0), 0.95) is None
    assert percentile_s((50, 49, 1), 0.5) == 0.001
    assert percentile_s((50, 44, 6), 0.95) == 0.005
    beyond = (0,) * len(LATENCY_BUCKETS) + (3,)  # past the last bound: at least that
    assert percentile_s(beyond, 0.95) == LATENCY_BUCKETS[-1]


def test_ranges_have_a_readable_number_of_aligned_steps() -> None:
    assert {name: r.points for name, r in RANGES.items()} == {"15m": 15, "24h": 96, "7d": 84}
    assert start_of(RANGES["15m"], NOW) == datetime(2026, 12, 1, 11, 53, tzinfo=UTC)
    assert start_of(RANGES["24h"], NOW) == datetime(2026, 11, 30, 12, 15, tzinfo=UTC)
    assert parse_range(None).name == "15m" and parse_range("7d").step_s == 7200
    with pytest.raises(HistoryRequestError, match="one of 15m, 24h, 7d"):
        parse_range("30d")
    assert parse_queue(None) == parse_queue("") == ALL_QUEUES and parse_queue("mail") == "mail"
    with pytest.raises(HistoryRequestError):
        parse_queue("x" * 201)


def test_a_reading_difference_is_per_bucket() -> None:
    before = Reading(started=10, succeeded=8, buckets=[4, 9, 10])
    now = Reading(started=15, succeeded=12, retried=1, dead=1, buckets=[6, 14, 15])
    assert difference(now, before) == Counts(5, 4, 1, 1, (2, 3, 0))
    assert difference(before, None) == Counts(10, 8, 0, 0, (4, 5, 1))
    assert difference(before, before) == Counts()
    total = with_total({"a": Counts(1, latency=(1,), oldest_ready_s=2.0), "b": Counts(2)})
    assert total[ALL_QUEUES] == Counts(3, latency=(1,), oldest_ready_s=2.0)


def points(name: str) -> list[dict[str, object]]:
    r = RANGES[name]
    since = start_of(r, NOW)
    return [
        point(since + timedelta(seconds=i * r.step_s), Counts(i, i, i % 2, 0, (i, 1), 2.5))
        for i in range(r.points)
    ]


@pytest.mark.parametrize("name", list(RANGES))
def test_charts_have_axes_a_legend_and_a_title_per_step(name: str) -> None:
    r = RANGES[name]
    counts = str(counts_chart(points(name), r))  # type: ignore[arg-type]
    assert counts.count("<title>") == r.points
    assert re.findall(r'<g class="legend">.*?</g>', counts)[0].count("<text") == 4
    assert 'class="tick"' in counts and "<polyline" in counts
    assert "started 1, succeeded 1, retried 1, dead 0; oldest ready 2.5 s</title>" in counts
    latency = str(latency_chart(points(name), r))  # type: ignore[arg-type]
    assert latency.count("<title>") == r.points and "p95 ≤" in latency
    assert "1 ms" in latency  # a decade tick of the log axis
    assert "<script" not in counts + latency and "style=" not in counts + latency


def test_an_empty_range_draws_axes_and_says_nothing_started() -> None:
    r = RANGES["15m"]
    empty = [point(start_of(r, NOW) + timedelta(minutes=i), Counts()) for i in range(15)]
    latency = str(latency_chart(empty, r))
    assert "nothing started" in latency and "<polyline" not in latency
    assert nice_ceiling(0) == 1 and nice_ceiling(7) == 10 and nice_ceiling(130) == 200
