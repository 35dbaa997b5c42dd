"""A claim loop whose plain claim emptied its queue waits for a wake-up without asking the
database again (the claim's `drained` marker, migration 047): before, every claim that took
fewer jobs than it asked was followed by `ready_left`, a round trip and a statement per job of
a steady stream. A real daemon in this process, jobs one at a time through the SQL door (each
wakes the loop with its notice); the work poll runs once an hour, so each start comes from a
wake-up, and none is lost.
"""

from __future__ import annotations

import json

import asyncpg

from tests.harness import Target, make_settings, running_daemon, serve_target, wait_until

JOBS = 8


async def test_a_drained_claim_waits_for_a_wake_up_without_looking_again(db_url: str) -> None:
    settings = make_settings(db_url, scan_interval_s=3600)
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target := Target()), running_daemon(settings) as d:
            claims = d.daemon._claims
            assert claims is not None
            looks = 0
            look = claims.ready_left

            async def counted(queue: str, capabilities: list[str]) -> bool:
                nonlocal looks
                looks += 1
                return await look(queue, capabilities)

            claims.ready_left = counted  # type: ignore[method-assign]
            for n in range(JOBS):
                job_id = await conn.fetchval(
                    "SELECT dispatcher.enqueue($1, 'http', target => $2::jsonb)",
                    f"drained-{n}",
                    json.dumps({"url": target.url}),
                )

                async def succeeded(job_id: int = job_id) -> bool:
                    state = await conn.fetchval(
                        "SELECT state FROM dispatcher.jobs WHERE id = $1", job_id
                    )
                    return bool(state == "succeeded")

                await wait_until(succeeded, timeout_s=10, what=f"job {n} to succeed")
    finally:
        await conn.close()
    assert len(target.requests) == JOBS
    assert looks == 0  # before migration 047: a look after each claim
