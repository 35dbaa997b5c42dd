"""Start and concurrency limits of a queue.

`TokenBucket` bounds starts: over any window of T seconds at most `burst + rate * T` start.
`InflightLimit` bounds running jobs. Both are reserved *before* a claim and the unused part is
returned after it, so concurrent claim loops can never overshoot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    """Classic token bucket; `clock` is injectable so tests can pin time."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate_per_s)
        self._updated = now

    def take_up_to(self, wanted: int) -> int:
        """Take as many whole tokens as available, at most `wanted`; return how many."""
        self._refill()
        granted = min(wanted, int(self._tokens))
        self._tokens -= granted
        return granted

    def give_back(self, unused: int) -> None:
        self._tokens = min(self.burst, self._tokens + unused)

    def seconds_until_available(self, n: int = 1) -> float:
        self._refill()
        missing = n - self._tokens
        return 0.0 if missing <= 0 else missing / self.rate_per_s


class InflightLimit:
    """A counting limit with reservation of several slots at once and a wait for a free slot."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Event()

    def reserve_up_to(self, wanted: int) -> int:
        granted = max(0, min(wanted, self.limit - self.used))
        self.used += granted
        return granted

    def release(self, n: int = 1) -> None:
        self.used -= n
        self._freed.set()

    async def wait_for_free_slot_or(self, stop: asyncio.Event) -> None:
        """Return once a slot is free or `stop` is set (`release(0)` wakes a waiter)."""
        while self.used >= self.limit and not stop.is_set():
            self._freed.clear()
            await self._freed.wait()
