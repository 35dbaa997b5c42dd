"""A burst due at one instant is moved to ready ahead of it (`scan_ahead_s`), and started at it,
never before: by the daemon that moved it, whose timer wakes its claim loops at the due time
(the work poll here runs once an hour, so nothing else would), and, when that daemon is killed
with SIGKILL before the instant, by another daemon's work poll."""

from __future__ import annotations

import json
import signal
from datetime import datetime
from typing import Any

import asyncpg

from dispatcher.config.settings import Settings
from tests.harness import (
    LOOPBACK_ENV,
    Target,
    make_settings,
    running_daemon,
    serve_target,
    wait_until,
)
from tests.harness.fixtures import Spawn

ENQUEUE = """SELECT count(*) FROM dispatcher.enqueue_many(
    (SELECT array_agg($1 || '-' || g) FROM generate_series(1, $2) g),
    array_fill('http'::text, ARRAY[$2]), array_fill('{}'::jsonb, ARRAY[$2]),
    array_fill($3::timestamptz, ARRAY[$2]), NULL, NULL, array_fill($4::jsonb, ARRAY[$2]))"""


async def enqueue_burst(
    conn: asyncpg.Connection, prefix: str, n: int, in_s: float, target: Target
) -> datetime:
    """`n` jobs due at one instant `in_s` from now by the database's clock; returns it."""
    due: datetime = await conn.fetchval("SELECT now() + make_interval(secs => $1)", in_s)
    await conn.fetchval(ENQUEUE, prefix, n, due, json.dumps({"url": target.url}))
    return due


async def count(conn: asyncpg.Connection, state: str) -> int:
    n: int = await conn.fetchval(
        "SELECT count(*) FROM dispatcher.job_state WHERE state = $1", state
    )
    return n


async def started_early(conn: asyncpg.Connection) -> int:
    n: int = await conn.fetchval(
        "SELECT count(*) FROM dispatcher.job_state WHERE started_at < due_at"
    )
    return n


async def test_a_burst_is_moved_before_its_instant_and_started_at_it(db_url: str) -> None:
    jobs = 300
    settings = make_settings(db_url, scan_interval_s=3600, scan_ahead_s=1.5)
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target := Target()), running_daemon(settings):
            due = await enqueue_burst(conn, "burst", jobs, 2.5, target)

            async def all_ready() -> bool:
                return await count(conn, "ready") == jobs

            await wait_until(all_ready, timeout_s=10, what="the burst moved to ready")
            assert await conn.fetchval("SELECT now()") < due  # moved ahead of its instant
            assert target.requests == []

            async def all_done() -> bool:
                return await count(conn, "succeeded") == jobs

            await wait_until(all_done, timeout_s=20, what="the burst to run")
    finally:
        await conn.close()
    assert len(target.requests) == jobs
    conn = await asyncpg.connect(db_url)
    try:
        assert await started_early(conn) == 0
        first: float = await conn.fetchval(
            "SELECT extract(epoch FROM min(started_at) - $1::timestamptz)"
            "  FROM dispatcher.job_state",
            due,
        )
        assert first >= 0
    finally:
        await conn.close()


async def test_jobs_moved_by_a_killed_daemon_start_on_another(db_url: str, spawn: Spawn) -> None:
    jobs = 40
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV}
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target := Target()):
            mover = await spawn({**env, "DISPATCHER_SCAN_AHEAD_S": "10"})
            due = await enqueue_burst(conn, "orphan", jobs, 4.0, target)

            async def all_ready() -> bool:
                return await count(conn, "ready") == jobs

            await wait_until(all_ready, timeout_s=10, what="the jobs moved ahead")
            mover.signal(signal.SIGKILL)
            await mover.wait()
            assert await conn.fetchval("SELECT now()") < due
            await spawn({**env, "DISPATCHER_SCAN_INTERVAL_S": "0.2"})

            async def all_done() -> bool:
                return await count(conn, "succeeded") == jobs

            await wait_until(all_done, timeout_s=30, what="the survivor to run them")
        assert len(target.requests) == jobs
        assert await started_early(conn) == 0
        assert await conn.fetchval("SELECT min(started_at) FROM dispatcher.job_state") >= due
    finally:
        await conn.close()


async def test_a_burst_moved_by_one_daemon_is_shared_at_its_instant(db_url: str) -> None:
    """The mover tells the other daemons when a burst falls due (one NOTIFY), so they take
    their share at once: here the second daemon starts after the move and its work poll runs
    once an hour, so without the notice it would start none (the mover needs 16 claims of 25
    for the burst; the notice reaches the other within a few milliseconds)."""
    jobs = 400
    queues = {"default": {"max_inflight": 1000, "claim_batch": 25}}

    def settings(name: str, **extra: Any) -> Settings:
        return make_settings(
            db_url, scan_interval_s=3600, instance_name=name, queues=queues, **extra
        )

    conn = await asyncpg.connect(db_url)
    try:
        async with (
            serve_target(target := Target(delay_s=0.2)),
            running_daemon(settings("mover", scan_ahead_s=5)),
        ):
            await enqueue_burst(conn, "shared", jobs, 3.0, target)

            async def all_ready() -> bool:
                return await count(conn, "ready") == jobs

            await wait_until(all_ready, timeout_s=10, what="the burst moved ahead")
            async with running_daemon(settings("other")):

                async def all_done() -> bool:
                    return await count(conn, "succeeded") == jobs

                await wait_until(all_done, timeout_s=30, what="the burst to run")
        owners = await conn.fetch(
            "SELECT split_part(owner, ':', 1) AS daemon, count(*) AS n"
            "  FROM dispatcher.attempt_history"
            " GROUP BY 1 ORDER BY 1"
        )
        assert {r["daemon"] for r in owners} == {"mover", "other"}, owners
        assert await started_early(conn) == 0
    finally:
        await conn.close()
