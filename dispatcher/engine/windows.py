"""A claim loop's run windows (dispatcher.cron.windows) and the settings a queue may change at
run time, as one daemon applies them to its own claim loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from dispatcher.cron.windows import WindowState, parse_windows, window_state
from dispatcher.engine.limiter import InflightLimit, TokenBucket

# The longest a claim loop waits without looking again at its limits and run windows, which
# may change at run time (dispatcher.engine.live_settings): a change holds within this.
RETUNE_S = 1.0


class RunWindows:
    """The run windows of one queue; the state is computed again only when it changes (an
    edge passed) or the windows do, so an open queue pays one comparison per claim."""

    def __init__(self, texts: Sequence[str]):
        self.texts: tuple[str, ...] = tuple(texts)
        self._windows = parse_windows(self.texts)
        self._state: WindowState | None = None

    def replace(self, texts: Sequence[str]) -> None:
        if tuple(texts) != self.texts:
            self.texts, self._windows, self._state = tuple(texts), parse_windows(texts), None

    def state(self, now: datetime | None = None) -> WindowState:
        now = now or datetime.now(UTC)
        state = self._state
        edge = None if state is None else state.opens_at or state.closes_at
        if state is None or (edge is not None and now >= edge):
            state = self._state = window_state(self._windows, now)
        return state

    def closed_for_s(self, now: datetime | None = None) -> float | None:
        """None while the queue may claim; else the seconds until a window opens (inf: none
        opens within the horizon)."""
        if not self._windows:
            return None
        now = now or datetime.now(UTC)
        state = self.state(now)
        if state.open:
            return None
        if state.opens_at is None:
            return float("inf")
        return max(0.0, (state.opens_at - now).total_seconds())


def retune(
    settings: Mapping[str, Any], bucket: TokenBucket, inflight: InflightLimit, windows: RunWindows
) -> None:
    """Apply a queue's settings in force to one daemon's token bucket, in-flight cap and run
    windows (the global limits are in the database already, migration 025)."""
    rate, burst = settings.get("rate_per_s"), settings.get("burst")
    if rate is not None and burst is not None:
        bucket.rate_per_s, bucket.burst = float(rate), int(burst)
    limit = settings.get("max_inflight")
    if limit is not None and limit != inflight.limit:
        inflight.limit = int(limit)
        inflight.release(0)  # a loop waiting for a slot looks again
    windows.replace(settings.get("windows") or ())
