"""Python handlers of the per-job deadline tests (loaded by the daemon as `module:function`)."""

from __future__ import annotations

import asyncio
from typing import Any


async def nap(job: Any, ctx: Any) -> dict[str, Any]:
    """Sleeps `payload.s` seconds: long enough to outlive a job's own deadline."""
    await asyncio.sleep(float(job.payload.get("s", 0)))
    return {"slept": job.payload.get("s", 0)}
