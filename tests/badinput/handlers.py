"""Python handlers named in the bad-input suite's daemon configuration."""

from __future__ import annotations

from typing import Any


async def noop(job: Any, ctx: Any) -> None:
    """Accepts any payload and does nothing: the suite is about intake, not effects."""
    return None
