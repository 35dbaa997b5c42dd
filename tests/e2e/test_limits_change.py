"""Lowered limits after a heavy drain and a SIGKILL, on real daemons (issue 22, "lowering a
queue's limits stalls it"; migration 024), over both transports.

The issue's report: 2 daemons drain 3,000 jobs at generous limits, one is killed with SIGKILL,
then 3 daemons start with rate 20/s, burst 5, 4 in flight, jobs of 0.3 s: they started 23-68
jobs in 10 s instead of about 128 (4 in flight / 0.3 s), because the permits the drain had
parked still capped the bucket's refill. Here: the first start comes within `1 / rate + 1 s`
of the work being there, the queue runs near its in-flight cap for the 10 s, and the new limits
hold from the first start, measured where the effects land (a loopback target).
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.harness import LOOPBACK_ENV, Target, serve_target, starts_above_bucket, wait_until
from tests.harness.fixtures import Spawn
from tests.transports import transport, transport_env  # noqa: F401 (fixtures: both transports)

DRAIN_JOBS = 3_000
GENEROUS = {  # what the drain ran with: the defaults, written out
    "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "1000",
    "DISPATCHER_QUEUES__DEFAULT__BURST": "1000",
    "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "2000",
}
RATE_PER_S, BURST, MAX_INFLIGHT, JOB_S = 20, 5, 4, 0.3
LOWER = {
    "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": str(RATE_PER_S),
    "DISPATCHER_QUEUES__DEFAULT__BURST": str(BURST),
    "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": str(MAX_INFLIGHT),
}
WINDOW_S = 10.0


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    async with serve_target(Target(delay_s=0.01)) as t:
        yield t


async def enqueue(db_url: str, target: Target, prefix: str, n: int) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.fetchval(
            """SELECT count(*) FROM dispatcher.enqueue_many(
                   (SELECT array_agg($3 || g) FROM generate_series(1, $1) g),
                   array_fill('http'::text, ARRAY[$1]),
                   array_fill('{}'::jsonb, ARRAY[$1]), NULL, NULL, NULL,
                   array_fill($2::jsonb, ARRAY[$1]))""",
            n,
            json.dumps({"url": target.url}),
            prefix,
        )
    finally:
        await conn.close()


async def succeeded(db_url: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE state = 'succeeded'")
        )
    finally:
        await conn.close()


async def parked(db_url: str) -> bool:
    conn = await asyncpg.connect(db_url)
    try:
        return bool(await conn.fetchval("SELECT sum(n) > 0 FROM dispatcher.claim_permits"))
    finally:
        await conn.close()


async def wake_until_parked(db_url: str, target: Target) -> None:
    """After a drain, the survivor's next claims find a full bucket again and park permits
    (migration 016): the state lower limits must meet. An idle daemon claims only when woken
    (the work poll), so a trickle of jobs wakes it until it has parked some."""
    trickle = iter(range(1_000))

    async def parked_after_a_claim() -> bool:
        await enqueue(db_url, target, f"trickle-{next(trickle)}-", 1)
        return await parked(db_url)

    await wait_until(parked_after_a_claim, timeout_s=30, interval_s=0.2, what="permits parked")


async def drain_and_kill_one(
    spawn: Spawn, env: dict[str, str], db_url: str, target: Target
) -> None:
    """Two daemons drain DRAIN_JOBS at generous limits; one is SIGKILLed mid-drain, the other
    finishes the drain (rescuing the killed one's jobs) and stops."""
    pair = await asyncio.gather(*(spawn({**env, **GENEROUS}) for _ in range(2)))
    await enqueue(db_url, target, "drain-", DRAIN_JOBS)
    await wait_until(
        lambda: len(target.requests) >= DRAIN_JOBS // 3, timeout_s=60, what="a third started"
    )
    pair[0].signal(signal.SIGKILL)
    await pair[0].wait()

    async def drained() -> bool:
        return await succeeded(db_url) == DRAIN_JOBS

    await wait_until(drained, timeout_s=90, interval_s=0.2, what="the drain")
    await wake_until_parked(db_url, target)
    assert await pair[1].stop() == 0


async def test_three_daemons_with_lower_limits_after_a_drain_and_a_kill_do_not_stall(
    db_url: str,
    target: Target,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV, **transport_env}
    await drain_and_kill_one(spawn, env, db_url, target)
    target.requests.clear()
    target.delay_s, target.max_inflight = JOB_S, 0
    trio = await asyncio.gather(*(spawn({**env, **LOWER}) for _ in range(3)))
    try:
        loop = asyncio.get_running_loop()
        await enqueue(db_url, target, "after-", 1_000)
        enqueued = loop.time()
        await wait_until(lambda: bool(target.requests), timeout_s=60, what="a first start")
        first = target.requests[0]["at"]
        await asyncio.sleep(WINDOW_S)  # the measurement window itself, not a wait for a result
        starts = sorted(r["at"] - first for r in target.requests if r["at"] - first <= WINDOW_S)
    finally:
        await asyncio.gather(*(d.stop() for d in trio), return_exceptions=True)

    assert first - enqueued <= 1 / RATE_PER_S + 1, f"first start after {first - enqueued:.2f} s"
    # about 128 (4 in flight / 0.3 s for 10 s); before the fix 0-68
    expected = MAX_INFLIGHT / JOB_S * WINDOW_S
    # at least half: a loaded machine (load 11 on 2 cores) slows each cycle from 0.3 to ~0.5 s;
    # the stall this guards against started nothing for 8-25 s
    assert len(starts) >= 0.5 * expected, f"{len(starts)} starts in {WINDOW_S:.0f} s"
    assert_within_limits(starts, target)  # the new limits held from the first start


async def starts_after(target: Target, since: float, window_s: float) -> list[float]:
    """The starts at the target within `window_s` of the first one after `since` (loop time)."""
    await wait_until(
        lambda: any(r["at"] >= since for r in target.requests), timeout_s=30, what="a start"
    )
    first = min(r["at"] for r in target.requests if r["at"] >= since)
    await asyncio.sleep(window_s - (asyncio.get_running_loop().time() - first))  # the window
    return sorted(r["at"] - since for r in target.requests if since <= r["at"] <= first + window_s)


def assert_within_limits(starts: list[float], target: Target) -> None:
    assert target.max_inflight <= MAX_INFLIGHT, target.max_inflight
    worst = starts_above_bucket(starts, BURST, RATE_PER_S)
    assert worst <= 1, f"{worst:.1f} starts above rate x t + burst"


async def test_after_a_pause_the_queue_starts_at_once_within_its_limits(
    db_url: str,
    target: Target,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV, **transport_env, **LOWER}
    target.delay_s = JOB_S
    pair = await asyncio.gather(*(spawn(env) for _ in range(2)))
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "UPDATE dispatcher.queues SET paused = true, paused_at = now() WHERE name = 'default'"
        )
        await enqueue(db_url, target, "paused-", 500)
        # paused for a while: the daemons' claims keep asking the limiter and start nothing
        await asyncio.sleep(3.0)  # the pause itself, not a wait for a result
        assert target.requests == []
        await conn.execute(
            "UPDATE dispatcher.queues SET paused = false, paused_at = NULL WHERE name = 'default'"
        )
        resumed = asyncio.get_running_loop().time()
        starts = await starts_after(target, resumed, 5.0)
    finally:
        await conn.close()
        await asyncio.gather(*(d.stop() for d in pair), return_exceptions=True)
    assert starts[0] <= 1 / RATE_PER_S + 1, f"first start {starts[0]:.2f} s after the resume"
    assert len(starts) >= 0.5 * MAX_INFLIGHT / JOB_S * 5.0, len(starts)  # as above
    assert_within_limits(starts, target)
