"""Handlers the benchmarks configure in the daemon (`tests.bench.handlers:noop`)."""

from __future__ import annotations

from typing import Any


async def noop(job: Any, ctx: Any) -> None:
    """Does nothing: what remains is the dispatcher's own cost per job."""
    return None


async def hold(job: Any, ctx: Any) -> None:
    """Runs for `hold_s` seconds of the payload (default 600): a job a killed daemon leaves
    running (bench_recovery)."""
    import asyncio

    await asyncio.sleep(float(job.payload.get("hold_s", 600)))
