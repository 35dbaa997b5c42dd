"""Python handlers for the lease and connection-pressure tests (loaded as `module:function`).

They run in the test's own process (an in-process daemon), so the test steers them through
module state: `DSN` for a side connection, `GATE` to hold handlers until the test lets go,
`STARTED`/`FINISHED` to observe them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

DSN = ""
GATE = asyncio.Event()
STARTED: list[tuple[str, int]] = []
FINISHED: list[tuple[str, int]] = []


async def sleeper(job: Any, ctx: Any) -> dict[str, Any]:
    """Works for `sleep_s` seconds (transactional or not, as configured)."""
    STARTED.append((job.key, job.attempt))
    await asyncio.sleep(float(job.payload["sleep_s"]))
    FINISHED.append((job.key, job.attempt))
    return {"slept": job.payload["sleep_s"]}


async def gated(job: Any, ctx: Any) -> dict[str, Any]:
    """Holds its transaction's connection until the test opens `GATE`, then works `work_s`."""
    STARTED.append((job.key, job.attempt))
    await GATE.wait()
    await asyncio.sleep(float(job.payload.get("work_s", 0)))
    await ctx.connection.execute("SELECT 1")
    FINISHED.append((job.key, job.attempt))
    return {"attempt": job.attempt}


async def loses_its_lease(job: Any, ctx: Any) -> dict[str, Any]:
    """Attempt 1 takes its own lease away (as a stalled heartbeat would) until this same
    process has claimed the job again, then finishes (`then`: "finish") or hangs until its
    timeout cancels it ("hang"). Later attempts work `second_s` seconds and succeed."""
    STARTED.append((job.key, job.attempt))
    if job.attempt > 1:
        await asyncio.sleep(float(job.payload["second_s"]))
        FINISHED.append((job.key, job.attempt))
        return {"attempt": job.attempt}
    await asyncio.sleep(float(job.payload.get("hold_s", 0)))
    conn = await asyncpg.connect(DSN)
    try:
        while await conn.fetchval("SELECT attempt FROM dispatcher.jobs WHERE id = $1", job.id) < 2:
            await conn.execute(
                "UPDATE dispatcher.jobs SET lease_expires_at = now() - interval '1 s'"
                " WHERE id = $1 AND attempt = 1 AND state = 'running'",
                job.id,
            )
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    if job.payload["then"] == "hang":
        await asyncio.Event().wait()
    FINISHED.append((job.key, job.attempt))
    return {"attempt": job.attempt}
