"""The supervised lifecycle (invariants 6 and 8): a background loop that dies turns the daemon
unready, drains and exits non-zero, and a restart finishes every job; a drain that cannot hand
its leases back (database down) says so and exits non-zero."""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

import aiohttp

from tests.faults.common import (
    PrivatePostgres,
    create_effects_table,
    daemon_env,
    effects_per_key,
    fetchval,
    post_batch,
)
from tests.harness import until_job_states, wait_until
from tests.harness.fixtures import Spawn


def record_jobs(prefix: str, n: int, sleep_s: float) -> list[dict[str, object]]:
    return [
        {"idempotency_key": f"{prefix}-{i}", "handler": "record", "payload": {"sleep_s": sleep_s}}
        for i in range(n)
    ]


async def test_a_claim_loop_that_dies_stops_the_daemon_and_a_restart_finishes(
    db_url: str, spawn: Spawn
) -> None:
    await create_effects_table(db_url)
    env = daemon_env(
        db_url,
        DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT="4",
        DISPATCHER_FAULT="raise:claim:default",
    )
    daemon = await spawn(env)
    await post_batch(daemon.base_url, record_jobs("supervised", 20, 1.0))

    async def unready() -> bool:
        try:
            return (await _get(daemon.base_url + "/readyz"))[0] == 503
        except aiohttp.ClientError:
            return daemon.proc is not None and daemon.proc.returncode is not None

    await wait_until(unready, timeout_s=20, what="/readyz 503 after the claim loop died")
    assert await daemon.wait(timeout_s=30) == 1
    log = daemon.log_text()
    assert "service task claim:default failed: FaultInjected" in log
    assert "Traceback" in log  # the failure is logged with its traceback
    assert "dispatcher stopped after a failure" in log

    env.pop("DISPATCHER_FAULT")
    restarted = await spawn(env)
    await until_job_states(db_url, {"succeeded": 20}, timeout_s=60)
    assert await restarted.stop() == 0
    effects = await effects_per_key(db_url)
    assert sorted(effects) == sorted(f"supervised-{i}" for i in range(20))
    assert set(effects.values()) == {1}


async def test_sigterm_with_the_database_down_says_so_and_exits_non_zero(spawn: Spawn) -> None:
    state = Path(tempfile.mkdtemp(prefix="dispatcher-faults-down-"))
    pg = PrivatePostgres(state)
    try:
        url = await pg.start()
        await create_effects_table(url)
        env = daemon_env(
            url,
            DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT="5",
            DISPATCHER_DRAIN_TIMEOUT_S="1",
            DISPATCHER_HARD_STOP_TIMEOUT_S="2",
            DISPATCHER_LEASE_S="3",
        )
        daemon = await spawn(env)
        await post_batch(daemon.base_url, record_jobs("down", 5, 8.0))

        async def five_running() -> bool:
            n = "SELECT count(*) FROM dispatcher.jobs WHERE state = 'running'"
            return await fetchval(url, n) == 5

        await wait_until(five_running, timeout_s=20, what="five attempts running")
        await pg.stop_server()
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=30) == 1
        log = daemon.log_text()
        assert "could not hand 5 unfinished jobs back" in log, log[-3000:]
        assert "Task exception was never retrieved" not in log

        # nothing is lost: once the database is back, the leases expire and a daemon finishes
        await pg.start_server()
        env["DISPATCHER_DRAIN_TIMEOUT_S"] = "5"
        await spawn({**env, "DISPATCHER_FAULT": ""})
        await until_job_states(url, {"succeeded": 5}, timeout_s=90)
    finally:
        await pg.close()
        shutil.rmtree(state, ignore_errors=True)


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()
