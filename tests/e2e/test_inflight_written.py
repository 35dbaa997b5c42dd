"""A queue at its `max_inflight`: a slot frees when a job's effect ends, but the job is `running`
in the database until its success is written, and the claim's grant counts it there. A claim
sent for the slot before the write is refused; the loop then waits for this daemon's write
(engine/queue_worker.py `_until_written`), not a fixed 20 ms after which it asks again.

The write is held up here by a lock on the job's row (as a slow database would), for a second:
before, the loop asked every 20 ms, and each claim was refused (about fifty); now it asks again
when the write ends, or every `UNTIL_WRITTEN_S` while it does not.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
from aiohttp import web

from dispatcher.engine.queue_worker import UNTIL_WRITTEN_S
from tests.harness import Target, make_settings, running_daemon, serve_target, wait_until

HOLD_S = 1.0


async def test_a_claim_refused_for_a_success_in_writing_waits_for_the_write(db_url: str) -> None:
    settings = make_settings(
        db_url, queues={"default": {"max_inflight": 1, "rate_per_s": 1000, "burst": 100}}
    )
    conn = await asyncpg.connect(db_url)
    locker = await asyncpg.connect(db_url)
    held = asyncio.Event()

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        if request.headers.get("Idempotency-Key") == "first" and not held.is_set():
            # the first job's row locked before its effect ends: its success waits to be written
            tx = locker.transaction()
            await tx.start()
            await locker.execute(
                "SELECT 1 FROM dispatcher.job_state s JOIN dispatcher.intents i ON i.id = s.id"
                " WHERE i.key = 'first' FOR UPDATE OF s"
            )
            held.set()
            asyncio.get_running_loop().call_later(
                HOLD_S, lambda: asyncio.ensure_future(tx.commit())
            )
        return web.json_response({"ok": True})

    try:
        async with serve_target(target := Target(respond=respond)), running_daemon(settings) as d:
            claims = d.daemon._claims
            assert claims is not None
            refused = 0
            claim = claims.claim

            async def counted(*args: Any, **kwargs: Any) -> Any:
                nonlocal refused
                done = await claim(*args, **kwargs)
                if not done.jobs and done.wait_s is not None:
                    refused += 1
                return done

            claims.claim = counted  # type: ignore[method-assign]
            for key in ("first", "second"):
                await conn.fetchval(
                    "SELECT dispatcher.enqueue($1, 'http', target => $2::jsonb)",
                    key,
                    json.dumps({"url": target.url}),
                )
            await target.wait_for(lambda t: len(t.requests) == 2, timeout_s=20)
            assert held.is_set()

            async def both_succeeded() -> bool:
                n = await conn.fetchval(
                    "SELECT count(*) FROM dispatcher.job_state WHERE state = 'succeeded'"
                )
                return bool(n == 2)

            await wait_until(both_succeeded, timeout_s=20, what="both jobs to succeed")
    finally:
        await locker.close()
        await conn.close()
    assert target.max_inflight == 1
    # one refusal, then one per UNTIL_WRITTEN_S while the write waits (and a spare): about
    # fifty before, one every 20 ms
    assert 1 <= refused <= HOLD_S / UNTIL_WRITTEN_S + 2, refused
