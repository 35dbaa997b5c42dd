"""Handlers the benchmarks configure in the daemon (`tests.bench.handlers:noop`)."""

from __future__ import annotations

from typing import Any


async def noop(job: Any, ctx: Any) -> None:
    """Does nothing: what remains is the dispatcher's own cost per job."""
    return None
