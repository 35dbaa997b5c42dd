"""Real daemon processes, real signals: crash windows and graceful drain (invariants 1, 2, 6)."""

from __future__ import annotations

import signal
import time
from collections import Counter

import aiohttp
import asyncpg

from tests.harness import LOOPBACK_ENV, Target, job_changes, serve_target
from tests.harness.fixtures import Spawn

BASE_ENV = {
    **LOOPBACK_ENV,
    "DISPATCHER_LEASE_S": "2",
}
PYTHON_HANDLER = {
    "DISPATCHER_HANDLERS__RECORD__KIND": "python",
    "DISPATCHER_HANDLERS__RECORD__FUNCTION": "tests.e2e.handlers:record_effect",
}


async def states(db_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch("SELECT state, count(*) n FROM dispatcher.jobs GROUP BY state")
        return {r["state"]: r["n"] for r in rows}
    finally:
        await conn.close()


async def test_sigkill_after_in_db_effect_before_commit_applies_effect_once(
    db_url: str, spawn: Spawn
) -> None:
    conn = await asyncpg.connect(db_url)
    await conn.execute("CREATE TABLE app_effects (job_key text, payload jsonb)")
    env = {"DISPATCHER_DATABASE_URL": db_url, **BASE_ENV, **PYTHON_HANDLER}
    crashing = await spawn({**env, "DISPATCHER_FAULT": "after_effect_in_transaction"})
    await crashing.post_job(
        "lease-4831:revoke-upload-grants:2026-05-31",
        {"handler": "record", "payload": {"lease": 4831}},
    )
    assert await crashing.wait() == -signal.SIGKILL
    assert await states(db_url) == {"running": 1}  # killed holding the lease
    assert await conn.fetchval("SELECT count(*) FROM app_effects") == 0  # rolled back

    async with job_changes(db_url) as jobs:
        restarted = await spawn(env)
        await jobs.until_states({"succeeded": 1})  # completed after the restart
    assert await restarted.stop() == 0
    rows = await conn.fetch("SELECT job_key FROM app_effects")
    assert [r["job_key"] for r in rows] == ["lease-4831:revoke-upload-grants:2026-05-31"]
    job = await conn.fetchrow("SELECT attempt, result FROM dispatcher.jobs")
    assert (
        job["attempt"] == 2
        and job["result"] == '{"recorded": "lease-4831:revoke-upload-grants:2026-05-31"}'
    )
    await conn.close()


async def test_sigkill_after_http_effect_redelivers_the_same_idempotency_key(
    db_url: str, spawn: Spawn
) -> None:
    target = Target()
    async with serve_target(target), job_changes(db_url) as jobs:
        env = {"DISPATCHER_DATABASE_URL": db_url, **BASE_ENV}
        crashing = await spawn({**env, "DISPATCHER_FAULT": "after_effect"})
        await crashing.post_job("webhook-1", {"handler": "http", "target": {"url": target.url}})
        assert await crashing.wait() == -signal.SIGKILL
        restarted = await spawn(env)
        await jobs.until_states({"succeeded": 1})  # redelivered and completed
        assert await restarted.stop() == 0
    assert target.request_keys() == ["webhook-1", "webhook-1"]
    first, second = target.requests
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"]
    assert first["body"] == second["body"]


async def test_sigkill_after_completion_before_ack_does_not_repeat(
    db_url: str, spawn: Spawn
) -> None:
    target = Target()
    async with serve_target(target):
        env = {"DISPATCHER_DATABASE_URL": db_url, **BASE_ENV}
        crashing = await spawn({**env, "DISPATCHER_FAULT": "after_complete"})
        await crashing.post_job("acked-late", {"handler": "http", "target": {"url": target.url}})
        assert await crashing.wait() == -signal.SIGKILL
        assert await states(db_url) == {"succeeded": 1}
        restarted = await spawn(env)
        await restarted.stop()
    assert target.request_keys() == ["acked-late"]


async def test_sigterm_with_50_inflight_drains_and_loses_nothing(db_url: str, spawn: Spawn) -> None:
    target = Target(delay_s=1.5)
    async with serve_target(target), job_changes(db_url) as jobs:
        env = {
            "DISPATCHER_DATABASE_URL": db_url,
            **BASE_ENV,
            "DISPATCHER_DRAIN_TIMEOUT_S": "20",
            "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "50",
        }
        daemon = await spawn(env)
        batch = [
            {"idempotency_key": f"drain-{i}", "handler": "http", "target": {"url": target.url}}
            for i in range(80)
        ]
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{daemon.base_url}/v1/jobs/batch", json={"jobs": batch}) as r,
        ):
            assert r.status == 200
        await target.wait_for(lambda t: t.inflight == 50, what="50 in flight")
        started_at_signal = len(target.requests)
        signalled = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=25) == 0
        elapsed = time.monotonic() - signalled
        assert len(target.requests) == started_at_signal == 50  # no start after the signal
        assert elapsed < 20
        left = await states(db_url)
        assert "running" not in left and left.get("succeeded") == 50, left
        restarted = await spawn(env)
        await jobs.until_states({"succeeded": 80})
        assert await restarted.stop() == 0
    assert max(Counter(target.request_keys()).values()) == 1


async def test_drain_timeout_releases_unfinished_jobs_at_once(db_url: str, spawn: Spawn) -> None:
    target = Target(delay_s=60)
    async with serve_target(target):
        env = {
            "DISPATCHER_DATABASE_URL": db_url,
            **BASE_ENV,
            "DISPATCHER_DRAIN_TIMEOUT_S": "1",
            "DISPATCHER_LEASE_S": "300",
        }
        daemon = await spawn(env)
        await daemon.post_job(
            "hangs", {"handler": "http", "target": {"url": target.url, "timeout_s": 120}}
        )
        await target.wait_for(lambda t: t.inflight == 1)
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=15) == 0
    conn = await asyncpg.connect(db_url)
    job = await conn.fetchrow("SELECT state, attempt, lease_owner FROM dispatcher.jobs")
    outbox = await conn.fetchval("SELECT count(*) FROM dispatcher.outbox")
    await conn.close()
    # handed back for another instance right away (not after the 300 s lease), attempt not spent
    # ready again, attempt not counted; in process no outbox row (migration 015)
    assert (job["state"], job["attempt"], job["lease_owner"], outbox) == ("ready", 0, None, 0)


async def test_second_signal_skips_the_drain_wait(db_url: str, spawn: Spawn) -> None:
    target = Target(delay_s=60)
    async with serve_target(target):
        env = {
            "DISPATCHER_DATABASE_URL": db_url,
            **BASE_ENV,
            "DISPATCHER_DRAIN_TIMEOUT_S": "60",
            "DISPATCHER_LEASE_S": "300",
        }
        daemon = await spawn(env)
        await daemon.post_job(
            "stuck", {"handler": "http", "target": {"url": target.url, "timeout_s": 120}}
        )
        await target.wait_for(lambda t: t.inflight == 1)
        daemon.signal(signal.SIGTERM)
        await daemon.log.wait_for("stop signal: draining")
        signalled = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=15) == 0
        assert time.monotonic() - signalled < 10  # not the 60 s drain budget
    assert await states(db_url) == {"ready": 1}  # handed back, nothing lost
