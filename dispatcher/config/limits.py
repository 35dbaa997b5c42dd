"""Limit groups: a budget that several queues share (issue 22 point 2).

`[limit_groups.NAME]` gives a group's start rate (with its burst) and in-flight cap; a queue
joins with `limit_group = "NAME"` and ranks within it by `group_priority` (lower goes first
when the budget is short). All limits are global across daemons: the database holds them
(migration 024), every claim takes from its queue's limits and from its group's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pydantic import Field

from dispatcher.config.base import MAX_BURST, MAX_RATE_PER_S, Strict


class LimitGroupSettings(Strict):
    """One group's budget; a limit left unset does not bind (set at least one)."""

    rate_per_s: float | None = Field(None, gt=0, le=MAX_RATE_PER_S)
    burst: int | None = Field(None, ge=1, le=MAX_BURST)
    max_inflight: int | None = Field(None, ge=1, le=100_000)

    def limits(self) -> tuple[float | None, int | None, int | None]:
        """(rate_per_s, burst, max_inflight) as the registry stores them; a rate without a
        burst gets a burst of one second's worth."""
        burst = self.burst
        if self.rate_per_s is not None and burst is None:
            burst = max(1, round(self.rate_per_s))
        return self.rate_per_s, burst, self.max_inflight


class _Member(Protocol):
    @property
    def limit_group(self) -> str | None: ...


def check_limit_groups(
    groups: Mapping[str, LimitGroupSettings], queues: Mapping[str, _Member]
) -> None:
    """Raise ValueError naming the fix when a queue names a group that is not configured or a
    group limits nothing."""
    for name, group in groups.items():
        if group.rate_per_s is None and group.max_inflight is None:
            raise ValueError(
                f"limit group {name!r} limits nothing: set rate_per_s (and burst) or "
                "max_inflight under [limit_groups." + name + "], or remove it"
            )
        if group.burst is not None and group.rate_per_s is None:
            raise ValueError(
                f"limit group {name!r} has a burst but no rate_per_s: set rate_per_s too"
            )
    for queue, settings in queues.items():
        wanted = settings.limit_group
        if wanted is not None and wanted not in groups:
            known = ", ".join(sorted(groups)) or "none configured"
            raise ValueError(
                f"queue {queue!r}: limit_group {wanted!r} is not in [limit_groups] "
                f"({known}); add [limit_groups.{wanted}] or fix the name"
            )
