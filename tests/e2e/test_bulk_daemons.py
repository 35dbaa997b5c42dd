"""Bulk actions on two real daemon processes sharing one database: the same filter sent to
both at once moves every job exactly once (each daemon takes what the other has not), the same
key sent to both runs once (the other answers 409 while it runs, or replays it after), and each
daemon writes one audit line per bulk action and counts its jobs in
dispatcher_bulk_jobs_total."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import asyncpg

from tests.harness import LOOPBACK_ENV, DaemonProcess
from tests.harness.fixtures import Spawn

QUEUE = "work"
JOBS = 3000


async def post(daemon: DaemonProcess, path: str, body: Any = None, **headers: str) -> Any:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{daemon.base_url}{path}", json=body, headers=headers) as r,
    ):
        return r.status, await r.json(content_type=None)


async def applied_metric(daemon: DaemonProcess, action: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{daemon.base_url}/metrics") as r:
        text = await r.text()
    prefix = f'dispatcher_bulk_jobs_total{{action="{action}",outcome="applied"}}'
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(prefix))


async def test_two_daemons_never_move_a_job_twice(db_url: str, spawn: Spawn) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV,
           f"DISPATCHER_QUEUES__{QUEUE.upper()}__MAX_INFLIGHT": "5"}  # fmt: skip
    a, b = [await spawn(env) for _ in range(2)]
    status, _ = await post(a, f"/v1/queues/{QUEUE}/pause")  # retried jobs stay ready
    assert status == 200
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            """INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state,
                   due_at, attempt, max_attempts, max_retry_age_s, budget_started_at,
                   finished_at, dead_reason)
               SELECT 'dead-' || g, md5(g::text), $1, 'http', '{}', 'dead', now(), 3, 3, 600,
                      now(), now(), 'attempts_exhausted'
                 FROM generate_series(1, $2) g""",
            QUEUE,
            JOBS,
        )
        body = {"filter": {"queue": QUEUE, "state": "dead"}}
        (sa, ra), (sb, rb) = await asyncio.gather(
            post(a, "/v1/jobs/bulk/retry", body), post(b, "/v1/jobs/bulk/retry", body)
        )
        assert (sa, sb) == (200, 200), (ra, rb)
        assert ra["applied"] + rb["applied"] == JOBS, (ra, rb)
        rows = await conn.fetch(
            "SELECT state, attempt, count(*)::int AS n FROM dispatcher.jobs GROUP BY 1, 2"
        )
        assert [tuple(r) for r in rows] == [("ready", 0, JOBS)]
        assert await applied_metric(a, "retry") + await applied_metric(b, "retry") == JOBS

        # one key, both daemons at once: it runs once
        same = {"Idempotency-Key": "cancel-work-once"}
        cancel = {"filter": {"queue": QUEUE}}
        answers = await asyncio.gather(
            post(a, "/v1/jobs/bulk/cancel", cancel, **same),
            post(b, "/v1/jobs/bulk/cancel", cancel, **same),
        )
        ran = [doc for status, doc in answers if status == 200 and not doc["replayed"]]
        others = [(status, doc) for status, doc in answers if not (status == 200 and doc in ran)]
        assert len(ran) == 1 and ran[0]["applied"] == JOBS, answers
        (status, doc), = others  # fmt: skip
        assert (status == 409 and "is running now" in doc["detail"]) or doc["replayed"], answers
        assert (
            await conn.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE state = 'cancelled'")
            == JOBS
        )
    finally:
        await conn.close()
    logs = a.log_text() + b.log_text()
    assert logs.count("operator action bulk retry jobs matching state=dead queue=work by") == 2
    assert logs.count("operator action bulk cancel jobs matching queue=work key") == 2
