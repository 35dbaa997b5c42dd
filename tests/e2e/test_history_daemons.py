"""The cluster-wide history on three real daemon processes sharing one database (issue 26,
point 1): whatever daemon ran a job, the history's totals are the cluster's (started, succeeded,
retried, dead each equal to what the jobs did), GET /v1/history on any daemon says so, and the
history outlives the daemons (stopped, and a new one started)."""

from __future__ import annotations

from typing import Any

import aiohttp
import asyncpg

from tests.harness import LOOPBACK_ENV, DaemonProcess
from tests.harness.fixtures import Spawn
from tests.harness.waits import wait_until

NOOP_JOBS = 3000
FAILING_JOBS = 50  # two attempts each: one retry, then dead
ENV = {
    **LOOPBACK_ENV,
    "DISPATCHER_HANDLERS__NOOP__KIND": "python",
    "DISPATCHER_HANDLERS__NOOP__FUNCTION": "tests.bench.handlers:noop",
    "DISPATCHER_HANDLERS__NOOP__TRANSACTIONAL": "false",
    "DISPATCHER_HANDLERS__FAIL__KIND": "python",
    "DISPATCHER_HANDLERS__FAIL__FUNCTION": "tests.e2e.handlers:fail_always",
    "DISPATCHER_HANDLERS__FAIL__TRANSACTIONAL": "false",
    "DISPATCHER_QUEUES__FLAKY__MAX_ATTEMPTS": "2",
    "DISPATCHER_QUEUES__FLAKY__BACKOFF_BASE_S": "0.05",
    "DISPATCHER_QUEUES__FLAKY__BACKOFF_CAP_S": "0.1",
}
EXPECTED = {
    "started": NOOP_JOBS + 2 * FAILING_JOBS,
    "succeeded": NOOP_JOBS,
    "retried": FAILING_JOBS,
    "dead": FAILING_JOBS,
}


async def enqueue(conn: asyncpg.Connection, prefix: str, handler: str, queue: str, n: int) -> None:
    await conn.execute(
        """SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg($1 || g) FROM generate_series(1, $4) g),
               array_fill($2::text, ARRAY[$4]), array_fill('{}'::jsonb, ARRAY[$4]),
               NULL, array_fill($3::text, ARRAY[$4]))""",
        prefix,
        handler,
        queue,
        n,
    )


async def totals(conn: asyncpg.Connection, queue: str = "*") -> dict[str, int]:
    row = await conn.fetchrow(
        """SELECT coalesce(sum(started), 0)::int AS started,
                  coalesce(sum(succeeded), 0)::int AS succeeded,
                  coalesce(sum(retried), 0)::int AS retried, coalesce(sum(dead), 0)::int AS dead
             FROM dispatcher.history WHERE queue = $1""",
        queue,
    )
    return dict(row)


async def api_totals(daemon: DaemonProcess) -> dict[str, int]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{daemon.base_url}/v1/history", params={"range": "24h"}) as r,
    ):
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
    return {f: sum(p[f] for p in body["points"]) for f in EXPECTED}


async def test_three_daemons_sum_to_the_cluster_and_the_history_outlives_them(
    db_url: str, spawn: Spawn
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **ENV}
    daemons = [await spawn(env) for _ in range(3)]
    conn = await asyncpg.connect(db_url)
    try:
        await enqueue(conn, "noop-", "noop", "default", NOOP_JOBS)
        await enqueue(conn, "fail-", "fail", "flaky", FAILING_JOBS)

        async def finished() -> bool:
            n = await conn.fetchval(
                "SELECT count(*) FROM dispatcher.jobs WHERE state IN ('succeeded', 'dead')"
            )
            return bool(n == NOOP_JOBS + FAILING_JOBS)

        await wait_until(finished, timeout_s=120, interval_s=0.2, what="every job finished")
        owners = await conn.fetchval("SELECT count(DISTINCT owner) FROM dispatcher.attempt_history")
        assert owners >= 2, "one daemon ran every job: the test would prove nothing"

        async def recorded() -> bool:
            return await totals(conn) == EXPECTED

        # every daemon flushes within 5 s of an attempt's end
        await wait_until(recorded, timeout_s=30, interval_s=0.2, what="the history's totals")
        by_queue = [await totals(conn, q) for q in ("default", "flaky")]
        assert by_queue == [
            {"started": NOOP_JOBS, "succeeded": NOOP_JOBS, "retried": 0, "dead": 0},
            {"started": 2 * FAILING_JOBS, "succeeded": 0, "retried": FAILING_JOBS,
             "dead": FAILING_JOBS},
        ]  # fmt: skip
        for daemon in daemons:
            assert await api_totals(daemon) == EXPECTED

        for daemon in daemons:
            assert await daemon.stop() == 0
        assert await totals(conn) == EXPECTED  # nothing added twice at stop
        fresh = await spawn(env)
        assert await api_totals(fresh) == EXPECTED  # a restart keeps the history
        await enqueue(conn, "later-", "noop", "default", 10)

        async def added() -> bool:
            return (await totals(conn))["succeeded"] == NOOP_JOBS + 10

        await wait_until(added, timeout_s=30, interval_s=0.2, what="the new daemon's counts")
    finally:
        await conn.close()
