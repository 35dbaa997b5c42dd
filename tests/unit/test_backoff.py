"""The retry backoff (dispatcher/engine/retry.py) is full jitter: each delay is uniform in
[0, min(cap, base * 2^(attempt-1))]. These tests fail for a constant delay, for a delay without
jitter (always the ceiling) and for one that ignores the cap. A seeded generator keeps them
stable; the sample sizes make the tolerances several standard errors wide."""

from __future__ import annotations

import random
import statistics

import pytest

from dispatcher.engine.retry import backoff_s

BASE_S = 1.0
CAP_S = 60.0
SAMPLES = 4000


def ceiling(attempt: int) -> float:
    return float(min(CAP_S, BASE_S * 2 ** (attempt - 1)))


def delays(attempt: int, n: int = SAMPLES, seed: int = 7) -> list[float]:
    rng = random.Random(seed * 1000 + attempt)
    return [backoff_s(attempt, BASE_S, CAP_S, rng) for _ in range(n)]


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 6, 7, 8, 20, 1000])
def test_every_delay_lies_within_zero_and_the_capped_ceiling(attempt: int) -> None:
    sample = delays(attempt)
    assert min(sample) >= 0
    assert max(sample) <= ceiling(attempt)
    # full jitter reaches across the whole range, not only near the ceiling
    assert min(sample) < 0.01 * ceiling(attempt)
    assert max(sample) > 0.99 * ceiling(attempt)


def test_the_mean_doubles_per_attempt_until_the_cap_then_stays() -> None:
    means = {a: statistics.fmean(delays(a)) for a in range(1, 10)}
    for attempt, mean in means.items():
        # the mean of uniform [0, c] is c/2; its standard error here is c/sqrt(12*4000) < 0.5 %
        assert mean == pytest.approx(ceiling(attempt) / 2, rel=0.03), attempt
    for attempt in range(1, 6):  # 1, 2, 4, 8, 16, 32 s: below the 60 s cap
        assert means[attempt + 1] > 1.8 * means[attempt]
    # 64, 128, 256 s would pass the cap: every later attempt has the same distribution
    assert means[7] == pytest.approx(means[9], rel=0.05)
    assert means[9] == pytest.approx(CAP_S / 2, rel=0.03)


def test_delays_are_uniform_over_the_range() -> None:
    c = ceiling(4)
    counts = [0] * 10
    for delay in delays(4, 10_000):
        counts[min(int(delay / c * 10), 9)] += 1
    # each tenth expects 1,000 (standard deviation 30): a point mass or a narrow band fails
    assert all(880 <= n <= 1120 for n in counts), counts


def test_a_burst_of_retries_is_not_synchronised() -> None:
    # 500 jobs failing at one instant, on the same attempt: their next attempts spread out
    burst = delays(6, 500, seed=11)
    assert len(set(burst)) == len(burst)  # no two alike
    c = ceiling(6)
    per_slot = [0] * 100  # slots of 1 % of the range
    for delay in burst:
        per_slot[min(int(delay / c * 100), 99)] += 1
    assert max(per_slot) <= 20, max(per_slot)  # 5 expected per slot; never a herd
    assert statistics.pstdev(burst) > 0.25 * c  # uniform: c/sqrt(12) = 0.289 c


def test_huge_attempt_numbers_stay_finite_and_capped() -> None:
    for attempt in (63, 64, 10**6):
        assert 0 <= backoff_s(attempt, BASE_S, CAP_S, random.Random(1)) <= CAP_S


def test_without_a_generator_the_module_random_is_used() -> None:
    sample = [backoff_s(3, BASE_S, CAP_S) for _ in range(200)]
    assert all(0 <= d <= 4.0 for d in sample)
    assert len(set(sample)) > 190
