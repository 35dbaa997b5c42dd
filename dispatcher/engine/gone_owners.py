"""Which other daemons are gone: the judgement behind crash recovery in seconds (recovery.md).

The liveness lock's connection looks about every second at the registered daemons whose lock no
session holds (`dispatcher.db.liveness`) and reports each look here. An owner is judged gone once
it was absent at every look over at least `confirm_s`: one look could catch a daemon between
losing its lock connection and taking the lock again on a new one.

Two moments make every lock vanish at once without any daemon dying: a PostgreSQL restart (or
failover), and the loss of this daemon's own lock connection (the server may have restarted
under it). After either, nobody is judged gone for `grace_s`, so the living daemons have time to
reconnect and take their locks again; a frozen judge (no look for `stale_s`) judges nobody.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

CONFIRM_S = 1.0
GRACE_S = 5.0
STALE_S = 3.0


class GoneOwners:
    """Owners absent at every look since their first absent look; `confirmed()` names those
    absent for `confirm_s` or more, unless a restart or a lost lock is younger than `grace_s`."""

    def __init__(
        self,
        *,
        confirm_s: float = CONFIRM_S,
        grace_s: float = GRACE_S,
        stale_s: float = STALE_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._confirm_s = confirm_s
        self._grace_s = grace_s
        self._stale_s = stale_s
        self._clock = clock
        self._absent_since: dict[str, float] = {}
        self._last_look: float | None = None
        self._quiet_until = 0.0  # no judgement before this (restart or own lock lost)

    def observe(self, absent: Iterable[str], server_uptime_s: float) -> list[str]:
        """Record one look; returns the owners now confirmed gone."""
        now = self._clock()
        absent = set(absent)
        for owner in list(self._absent_since):
            if owner not in absent:
                del self._absent_since[owner]  # seen holding its lock: alive
        for owner in absent:
            self._absent_since.setdefault(owner, now)
        self._last_look = now
        self._quiet_until = max(self._quiet_until, now + self._grace_s - server_uptime_s)
        return self.confirmed()

    def lock_lost(self) -> None:
        """This daemon's own lock connection failed: every look so far may predate a restart."""
        self._absent_since.clear()
        self._last_look = None

    def lock_taken(self) -> None:
        """This daemon holds its lock again after losing it: wait for the others to do the same
        before judging anyone. (Not called for the first lock of a fresh daemon: a successor
        started after a crash judges as soon as its looks confirm, unless the server is young.)"""
        self._quiet_until = max(self._quiet_until, self._clock() + self._grace_s)

    def confirmed(self) -> list[str]:
        if self._last_look is None:
            return []
        now = self._clock()
        if now < self._quiet_until or now - self._last_look > self._stale_s:
            return []
        return sorted(
            owner
            for owner, since in self._absent_since.items()
            if self._last_look - since >= self._confirm_s
        )
