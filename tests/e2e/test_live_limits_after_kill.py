"""Limits lowered at run time (`dispatcher queues set`) after a heavy drain during which one of
two daemons was killed with SIGKILL, over both transports (issue 22 point 6): with the survivor
and two fresh daemons running (three, all started with the generous file), the change reaches
them without a restart, the next start comes within `1 / rate + 1 s`, the queue runs near its new
in-flight cap, and the new limits hold from the first start for the three together."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.test_limits_change import (
    BURST,
    GENEROUS,
    JOB_S,
    MAX_INFLIGHT,
    RATE_PER_S,
    assert_within_limits,
    enqueue,
    starts_after,
    succeeded,
    wake_until_parked,
)
from tests.harness import LOOPBACK_ENV, Target, cli, serve_target, wait_until
from tests.harness.fixtures import Spawn
from tests.transports import transport, transport_env  # noqa: F401 (fixtures: both transports)

DRAIN_JOBS = 2_000
WINDOW_S = 5.0


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    async with serve_target(Target(delay_s=0.01)) as t:
        yield t


async def test_limits_lowered_at_run_time_after_a_drain_and_a_kill_hold_without_a_stall(
    db_url: str,
    target: Target,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV, **transport_env, **GENEROUS}
    pair = await asyncio.gather(*(spawn(env) for _ in range(2)))
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
    await asyncio.gather(*(spawn(env) for _ in range(2)))
    result = await cli(
        "queues",
        "set",
        "default",
        *("--rate-per-s", str(RATE_PER_S), "--burst", str(BURST)),
        *("--max-inflight", str(MAX_INFLIGHT)),
        cwd=Path.cwd(),
        env=env,
    )
    assert result.code == 0, result.stderr
    target.requests.clear()
    target.delay_s, target.max_inflight = JOB_S, 0
    changed = asyncio.get_running_loop().time()
    await enqueue(db_url, target, "after-", 500)
    starts = await starts_after(target, changed, WINDOW_S)
    assert starts[0] <= 1 / RATE_PER_S + 1, f"first start {starts[0]:.2f} s after the change"
    assert len(starts) >= 0.75 * MAX_INFLIGHT / JOB_S * WINDOW_S, f"{len(starts)} starts"
    assert_within_limits(starts, target)
