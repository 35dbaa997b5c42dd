"""Python handlers named in the bad-input suite's daemon configuration."""

from __future__ import annotations

from typing import Any


async def noop(job: Any, ctx: Any) -> None:
    """Accepts any payload and does nothing: the suite is about intake, not effects."""
    return None


async def asks_for_a_delay(job: Any, ctx: Any) -> None:
    """Asks for a retry after `payload.delay` seconds: any float, inf and nan included."""
    ctx.retry_later("asked for a delay", float(job.payload["delay"]))
