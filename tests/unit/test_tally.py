"""Batched histogram updates leave exactly what one `observe` per value would."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram

from dispatcher.engine.tally import observe_many

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)


def samples(histogram: Histogram) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in histogram.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def pair() -> tuple[Histogram, Histogram]:
    return tuple(  # type: ignore[return-value]
        Histogram("h", "h", ["queue"], buckets=BUCKETS, registry=CollectorRegistry())
        for _ in range(2)
    )


@pytest.mark.parametrize(
    "values",
    [
        [],
        [0.0],
        [0.001, 0.01, 0.1, 1.0, 10.0],  # exactly on each bound: `le` is inclusive
        [0.0005, 0.002, 0.002, 0.5, 3.0, 11.0, 1e9, -1.0],
        [float("inf")],
        [0.5] * 1000,
    ],
)
def test_observe_many_equals_observe_per_value(values: list[float]) -> None:
    one_by_one, batched = pair()
    child = one_by_one.labels("q")
    for value in values:
        child.observe(value)
    observe_many(batched.labels("q"), values)
    assert samples(batched) == samples(one_by_one)


def test_nan_is_counted_in_no_bucket_as_with_observe() -> None:
    one_by_one, batched = pair()
    one_by_one.labels("q").observe(float("nan"))
    observe_many(batched.labels("q"), [float("nan")])
    got, want = samples(batched), samples(one_by_one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert (math.isnan(value) and math.isnan(got[key])) or got[key] == value, key


def test_a_child_without_the_known_internals_is_observed_one_by_one() -> None:
    seen: list[float] = []

    class Other:
        def observe(self, value: float) -> None:
            seen.append(value)

    observe_many(Other(), [1.0, 2.0])
    assert seen == [1.0, 2.0]
