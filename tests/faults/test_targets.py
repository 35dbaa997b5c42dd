"""Targets that misbehave: one that hangs past the job's timeout, one that answers 429 forever
(invariants 4 and 5: classified, backed off, bounded; never stuck `running`)."""

from __future__ import annotations

import asyncio
import itertools

from aiohttp import web

from tests.faults.common import daemon_env, fetch, post_job
from tests.harness import Target, serve_target, until_job_keys, until_job_states
from tests.harness.fixtures import Spawn

FAST_BACKOFF = {
    "DISPATCHER_QUEUES__DEFAULT__BACKOFF_BASE_S": "0.2",
    "DISPATCHER_QUEUES__DEFAULT__BACKOFF_CAP_S": "0.5",
}


async def job_row(db_url: str, key: str) -> dict:
    rows = await fetch(db_url, "SELECT * FROM dispatcher.jobs WHERE key = $1", key)
    return dict(rows[0])


async def test_target_hanging_past_its_timeout_is_retried_with_backoff_not_stuck(
    db_url: str, spawn: Spawn
) -> None:
    released = asyncio.Event()

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        if request.headers["Idempotency-Key"] == "hangs-always" or count == 1:
            await released.wait()  # hang well past the job's 1 s timeout
        return web.json_response({"ok": True})

    target = Target(respond=respond)
    async with serve_target(target):
        daemon = await spawn(daemon_env(db_url, **FAST_BACKOFF))
        hang = {"handler": "http", "target": {"url": target.url, "timeout_s": 1}}
        await post_job(daemon.base_url, "hangs-once", hang)
        await post_job(daemon.base_url, "hangs-always", {**hang, "max_attempts": 3})

        await until_job_states(db_url, {"dead": 1, "succeeded": 1}, timeout_s=30)
        released.set()
        assert await daemon.stop() == 0

    once = await job_row(db_url, "hangs-once")
    assert (once["state"], once["attempt"], once["lease_owner"]) == ("succeeded", 2, None)
    always = await job_row(db_url, "hangs-always")
    assert (always["state"], always["attempt"], always["dead_reason"]) == (
        "dead",
        3,
        "max_attempts",
    )
    assert always["last_error"] == "no response within 1 s (timeout)"
    times = {
        k: [r["at"] for r in target.requests if r["key"] == k]
        for k in ("hangs-once", "hangs-always")
    }
    assert [len(t) for t in times.values()] == [2, 3]
    for at in times.values():
        # each new attempt started only after the previous one timed out (1 s) and backed off
        assert all(b - a >= 0.95 for a, b in itertools.pairwise(at)), at


async def test_target_answering_429_forever_dies_at_max_retry_age_honouring_retry_after(
    db_url: str, spawn: Spawn
) -> None:
    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        return web.json_response({"error": "slow down"}, status=429, headers={"Retry-After": "1"})

    target = Target(respond=respond)
    async with serve_target(target):
        # a backoff far below 1 s: every delay is the target's Retry-After, never the jitter
        env = daemon_env(
            db_url,
            DISPATCHER_QUEUES__DEFAULT__BACKOFF_BASE_S="0.01",
            DISPATCHER_QUEUES__DEFAULT__BACKOFF_CAP_S="0.05",
        )
        daemon = await spawn(env)
        await post_job(
            daemon.base_url,
            "throttled",
            {
                "handler": "http",
                "target": {"url": target.url},
                "max_retry_age_s": 4,
                "max_attempts": 1000,
            },
        )

        await until_job_keys(db_url, {"throttled": "dead"}, timeout_s=20)  # max_retry_age_s
        assert await daemon.stop() == 0

    job = await job_row(db_url, "throttled")
    # the next time the target asked for lay past the 4 s retry age
    assert job["dead_reason"] == "retry_after_beyond_age", job
    assert job["last_error"].startswith("HTTP 429"), job["last_error"]
    at = [r["at"] for r in target.requests]
    gaps = [b - a for a, b in itertools.pairwise(at)]
    # Retry-After: 1 honoured every time (no tight loop), and the 4 s age bound stops it
    assert 2 <= len(at) <= 6, gaps
    assert min(gaps) >= 0.95, gaps
    assert job["attempt"] == len(at)


async def test_target_answering_429_with_retry_after_zero_does_not_tight_loop(
    db_url: str, spawn: Spawn
) -> None:
    """`Retry-After: 0` forever must still be backpressure (DESIGN invariant 4: "never
    tight-loop"): the attempts of one job should spread out like the queue's backoff."""

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        return web.json_response({"error": "slow down"}, status=429, headers={"Retry-After": "0"})

    target = Target(respond=respond)
    async with serve_target(target):
        env = daemon_env(db_url, DISPATCHER_QUEUES__DEFAULT__BACKOFF_BASE_S="0.5")
        daemon = await spawn(env)
        await post_job(
            daemon.base_url,
            "throttled-now",
            {
                "handler": "http",
                "target": {"url": target.url},
                "max_retry_age_s": 3,
                "max_attempts": 1000,
            },
        )

        await until_job_keys(db_url, {"throttled-now": "dead"}, timeout_s=20)  # max_retry_age_s
        assert await daemon.stop() == 0
    attempts = len(target.requests)
    print(f"\n429 + Retry-After: 0 for 3 s: {attempts} attempts")
    # exponential backoff from 0.5 s (full jitter) fits well under 20 attempts in 3 s
    assert attempts <= 20, f"{attempts} attempts in 3 s: a tight loop"
