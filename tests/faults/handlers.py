"""Python handlers for the fault-injection suite (the daemon loads `tests.faults.handlers:NAME`).

`record_effect` is an in-database business effect: one row in `fault_effects` per execution,
committed in the transaction that also records the job's completion. The row carries the
instance that ran it and how many handler calls were running in that process at entry, so
tests can check "one effect per key" and the per-instance in-flight limit from the database.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

INSTANCE = os.environ.get("DISPATCHER_INSTANCE_NAME") or f"pid-{os.getpid()}"
_running = 0


async def record_effect(job: Any, ctx: Any) -> dict[str, Any]:
    global _running
    _running += 1
    try:
        seen = _running
        delay_s = float(job.payload.get("sleep_s", 0))
        if delay_s:
            await asyncio.sleep(delay_s)
        await ctx.connection.execute(
            "INSERT INTO fault_effects (job_key, instance, inflight) VALUES ($1, $2, $3)",
            job.key,
            INSTANCE,
            seen,
        )
        return {"recorded": job.key}
    finally:
        _running -= 1
