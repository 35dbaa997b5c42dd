"""A limit group on two real daemons, over both transports (issue 22 point 2): seed 001's
notifications and cleanup share one budget ("a rate limit shared with other background jobs").

The group allows 30 starts/s (burst 10) and 6 in flight for both queues together; cleanup keeps
its own cap of 2 in flight; notifications has the better group_priority. Each daemon is
configured alike, so limits kept per daemon or per queue would show as twice as much. Measured
where the effects land: a loopback target, one path per queue.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.harness import LOOPBACK_ENV, Target, serve_target, starts_above_bucket, wait_until
from tests.harness.fixtures import Spawn
from tests.transports import transport, transport_env  # noqa: F401 (fixtures: both transports)

GROUP_RATE, GROUP_BURST, GROUP_INFLIGHT, CLEANUP_INFLIGHT = 30, 10, 6, 2
JOB_S = 0.3
JOBS = 60  # per queue
ENV = {
    **LOOPBACK_ENV,
    "DISPATCHER_LIMIT_GROUPS__BACKGROUND__RATE_PER_S": str(GROUP_RATE),
    "DISPATCHER_LIMIT_GROUPS__BACKGROUND__BURST": str(GROUP_BURST),
    "DISPATCHER_LIMIT_GROUPS__BACKGROUND__MAX_INFLIGHT": str(GROUP_INFLIGHT),
    "DISPATCHER_QUEUES__NOTIFICATIONS__LIMIT_GROUP": "background",
    "DISPATCHER_QUEUES__NOTIFICATIONS__GROUP_PRIORITY": "-10",
    "DISPATCHER_QUEUES__CLEANUP__LIMIT_GROUP": "background",
    "DISPATCHER_QUEUES__CLEANUP__GROUP_PRIORITY": "10",
    "DISPATCHER_QUEUES__CLEANUP__MAX_INFLIGHT": str(CLEANUP_INFLIGHT),
}


class CountingTarget(Target):
    """Also keeps the most requests in flight at once per path."""

    def __init__(self) -> None:
        super().__init__(delay_s=JOB_S)
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}

    async def _handle(self, request):  # type: ignore[no-untyped-def]
        path = request.path
        self.now[path] = self.now.get(path, 0) + 1
        self.most[path] = max(self.most.get(path, 0), self.now[path])
        try:
            return await super()._handle(request)
        finally:
            self.now[path] -= 1


@pytest.fixture
async def target() -> AsyncIterator[CountingTarget]:
    async with serve_target(CountingTarget()) as t:
        yield t  # type: ignore[misc]


async def enqueue(conn: asyncpg.Connection, target: Target, queue: str) -> None:
    await conn.fetchval(
        """SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg($2 || '-' || g) FROM generate_series(1, $1) g),
               array_fill('http'::text, ARRAY[$1]), array_fill('{}'::jsonb, ARRAY[$1]), NULL,
               array_fill($2::text, ARRAY[$1]), NULL, array_fill($3::jsonb, ARRAY[$1]))""",
        JOBS,
        queue,
        json.dumps({"url": target.url.rsplit("/", 1)[0] + "/" + queue}),
    )


async def test_two_daemons_share_a_groups_budget_better_priority_first(
    db_url: str,
    target: CountingTarget,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **ENV, **transport_env}
    pair = await asyncio.gather(*(spawn(env) for _ in range(2)))
    conn = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():  # both backlogs at once
            await enqueue(conn, target, "cleanup")
            await enqueue(conn, target, "notifications")
        await wait_until(
            lambda: len(target.requests) == 2 * JOBS, timeout_s=60, what="every job started"
        )
    finally:
        await conn.close()
        await asyncio.gather(*(d.stop() for d in pair), return_exceptions=True)

    starts = sorted((r["at"], r["path"]) for r in target.requests)
    assert target.max_inflight <= GROUP_INFLIGHT, target.max_inflight  # both queues together
    assert sum(1 for r in target.requests if r["path"] == "/notifications") == JOBS
    # both queues together within the group's rate (+1 for the start that opens a window)
    times = [t for t, _ in starts]
    worst = starts_above_bucket(times, GROUP_BURST, GROUP_RATE)
    assert worst <= 1, f"{worst:.1f} starts above the group's rate x t + burst"
    assert target.most["/cleanup"] <= CLEANUP_INFLIGHT  # its own cap holds inside the group
    # notifications first: while it had work waiting, cleanup took almost nothing (at most
    # what it held when notifications' backlog arrived, in the same transaction)
    last_notification = max(t for t, p in starts if p == "/notifications")
    early_cleanup = [t for t, p in starts if p == "/cleanup" and t < last_notification - 1.0]
    assert len(early_cleanup) <= CLEANUP_INFLIGHT, len(early_cleanup)
