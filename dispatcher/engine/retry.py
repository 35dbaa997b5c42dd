"""Retry policy: exponential backoff with full jitter, bounded by a cap."""

from __future__ import annotations

import random


def backoff_s(attempt: int, base_s: float, cap_s: float, rng: random.Random | None = None) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2^(attempt-1))] (attempt is 1-based)."""
    ceiling = min(cap_s, base_s * 2 ** min(attempt - 1, 62))
    return (rng or random).uniform(0, ceiling)
