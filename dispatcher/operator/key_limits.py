"""Overrides of one concurrency key's limits at run time (issue 22 point 4), shared by the doors
that set them (`PUT /v1/queues/{name}/keys/{key}`, `DELETE` back to the queue's, the CLI
`dispatcher queues key-limits NAME KEY`). Persisted in the database: every daemon's next claim
of the queue honours them, and a restart keeps them (the file's key_* settings are the default
every key without an override gets).

Input is checked here, once for every door: a bad value is refused with the fix named and
changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatcher.config.base import MAX_BURST, MAX_RATE_PER_S
from dispatcher.db.key_limits import KeyLimitsRepository, KeyOverride
from dispatcher.operator.errors import Invalid, NotFound

MAX_KEY_CHARS = 200  # as a job's concurrency_key (migration 023)
MAX_INFLIGHT = 100_000  # as a queue's max_inflight


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """What a door asks for one key (None: the queue's value for that one)."""

    max_inflight: int | None = None
    rate_per_s: float | None = None
    burst: int | None = None

    def check(self, key: str) -> None:
        """Raise Invalid (an operator refusal) naming the field and the fix."""
        if not 1 <= len(key) <= MAX_KEY_CHARS:
            raise Invalid(f"a concurrency key has 1 to {MAX_KEY_CHARS} characters", "key")
        if self.max_inflight is None and self.rate_per_s is None and self.burst is None:
            raise Invalid(
                "give at least one of max_inflight, rate_per_s, burst (to go back to the "
                "queue's limits, delete the override instead)"
            )
        if self.max_inflight is not None and not 1 <= self.max_inflight <= MAX_INFLIGHT:
            raise Invalid(f"must be between 1 and {MAX_INFLIGHT:,}", "max_inflight")
        if self.rate_per_s is not None and not 0 < self.rate_per_s <= MAX_RATE_PER_S:
            raise Invalid(
                f"must be a positive number of starts per second, at most {MAX_RATE_PER_S:g}",
                "rate_per_s",
            )
        if self.burst is not None and not 1 <= self.burst <= MAX_BURST:
            raise Invalid(f"must be between 1 and {MAX_BURST:,}", "burst")
        if self.burst is not None and self.rate_per_s is None:
            raise Invalid("is the burst of rate_per_s: give rate_per_s too", "burst")


def override_view(o: KeyOverride) -> dict[str, Any]:
    """An override as the doors show it."""
    return {
        "queue": o.queue,
        "key": o.key,
        "max_inflight": o.max_inflight,
        "rate_per_s": o.rate_per_s,
        "burst": o.burst,
        "updated_at": o.updated_at.isoformat(),
    }


async def set_key_limits(
    repo: KeyLimitsRepository, queue: str, key: str, limits: KeyLimits
) -> dict[str, Any]:
    """Store `limits` for `key` of `queue`; raise Invalid or NotFound."""
    limits.check(key)
    saved = await repo.set_override(
        queue, key, limits.max_inflight, limits.rate_per_s, limits.burst
    )
    if saved is None:
        raise NotFound(f"no queue {queue[:100]!r}: dispatcher queues lists the configured ones")
    return override_view(saved)


async def clear_key_limits(repo: KeyLimitsRepository, queue: str, key: str) -> bool:
    """`key` of `queue` goes back to the queue's limits; whether it had an override."""
    return await repo.clear_override(queue, key)
