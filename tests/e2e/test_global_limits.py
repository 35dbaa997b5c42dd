"""Global limits through three real daemons on one database: a queue limited to 50 starts/s
(burst 20) and 20 in flight holds those numbers for the three together, measured where the
effects land (a loopback target), not where the daemons think they are.

Each request takes 0.4 s at the target, so 20 in flight and 50/s bind at about the same point:
whichever limit leaked would show. Each daemon alone is configured with the same numbers; if the
limits were per daemon, three would start up to 150/s with 60 in flight. The same over both
transports: in process (claims from PostgreSQL) and RabbitMQ (leases of what was delivered).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.harness import LOOPBACK_ENV, Target, serve_target, starts_above_bucket
from tests.harness.fixtures import Spawn
from tests.transports import transport, transport_env  # noqa: F401

RATE_PER_S = 50
BURST = 20
MAX_INFLIGHT = 20
WINDOW_S = 12.0  # 600+ starts at the rate: enough to see a leak, short enough for CI
JOBS = 1_500  # more than the window can start, so the limits bind throughout

ENV = {
    **LOOPBACK_ENV,
    "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": str(RATE_PER_S),
    "DISPATCHER_QUEUES__DEFAULT__BURST": str(BURST),
    "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": str(MAX_INFLIGHT),
    "DISPATCHER_QUEUES__DEFAULT__CLAIM_BATCH": "50",
}


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    async with serve_target(Target(delay_s=0.4)) as t:
        yield t


async def test_three_daemons_share_one_rate_and_one_inflight_cap(
    db_url: str,
    target: Target,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **ENV, **transport_env}
    daemons = await asyncio.gather(*(spawn(env) for _ in range(3)))
    try:
        conn = await asyncpg.connect(db_url)
        try:
            await conn.fetchval(
                """SELECT count(*) FROM dispatcher.enqueue_many(
                       (SELECT array_agg('g' || g) FROM generate_series(1, $1) g),
                       array_fill('http'::text, ARRAY[$1]),
                       array_fill('{}'::jsonb, ARRAY[$1]), NULL, NULL, NULL,
                       array_fill($2::jsonb, ARRAY[$1]))""",
                JOBS,
                json.dumps({"url": target.url}),
            )
        finally:
            await conn.close()
        await target.wait_for(lambda t: bool(t.requests), timeout_s=30, what="a first start")
        first = target.requests[0]["at"]
        await asyncio.sleep(WINDOW_S)  # the measurement window itself, not a wait for a result
        starts = sorted(r["at"] - first for r in target.requests if r["at"] - first <= WINDOW_S)
    finally:
        await asyncio.gather(*(d.stop() for d in daemons), return_exceptions=True)

    # over every window [a, b] inside the run: starts <= burst + rate * (b - a) (+1 for the
    # start that opened the window)
    worst = starts_above_bucket(starts, BURST, RATE_PER_S)
    assert worst <= 1, f"{worst:.1f} starts above rate x t + burst"
    assert len(starts) <= BURST + RATE_PER_S * WINDOW_S + 1
    assert target.max_inflight <= MAX_INFLIGHT, target.max_inflight
    # and the limits did not starve the queue: it ran near one of its two limits
    assert len(starts) >= 0.6 * min(RATE_PER_S, MAX_INFLIGHT / 0.4) * WINDOW_S, len(starts)
