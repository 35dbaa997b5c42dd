"""The database misbehaving under a running daemon: restarted mid-batch, unreachable at start,
and its connection pool exhausted by a burst of intake (invariants 1 and 2, readiness)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

from tests.faults.common import (
    PrivatePostgres,
    create_effects_table,
    daemon_env,
    effects_per_key,
    fetch,
    fetchval,
    http_status,
    post_batch,
    states,
)
from tests.harness import DaemonProcess, free_port, until_job_states, wait_until
from tests.harness.fixtures import Spawn


async def test_postgres_restart_mid_batch_reconnects_and_loses_nothing(spawn: Spawn) -> None:
    state = Path(tempfile.mkdtemp(prefix="dispatcher-faults-pg-"))
    pg = PrivatePostgres(state)
    daemon: DaemonProcess | None = None
    try:
        url = await pg.start()
        await create_effects_table(url)
        env = daemon_env(url, DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT="4")
        daemon = await spawn(env)
        n = 300
        await post_batch(
            daemon.base_url,
            [
                {
                    "idempotency_key": f"pg-restart-{i}",
                    "handler": "record",
                    "payload": {"sleep_s": 0.02},
                }
                for i in range(n)
            ],
        )

        async def some_done() -> bool:
            return await fetchval(url, "SELECT count(*) FROM fault_effects") >= 50

        await wait_until(some_done, timeout_s=30, what="50 effects before the restart")
        done_at_stop = await fetchval(url, "SELECT count(*) FROM fault_effects")
        await pg.stop_server()
        await wait_until(
            lambda: _status_is(daemon, "/readyz", 503),
            timeout_s=15,
            what="/readyz 503 while the database is down",
        )
        assert await http_status(f"{daemon.base_url}/healthz") == 200  # alive, just not ready
        await pg.start_server()
        await wait_until(
            lambda: _status_is(daemon, "/readyz", 200),
            timeout_s=30,
            what="/readyz 200 once the database is back",
        )
        await until_job_states(url, {"succeeded": n}, timeout_s=60)
        effects = await effects_per_key(url)
        assert len(effects) == n and max(effects.values()) == 1, effects.most_common(3)
        assert daemon.proc is not None and daemon.proc.returncode is None
        assert await daemon.stop() == 0
        assert "unhandled error" not in daemon.log_text()
        print(
            f"\nPostgreSQL restarted after {done_at_stop} of {n} effects; "
            f"attempts per job: {await _attempt_histogram(url)}"
        )
        assert done_at_stop < n
    finally:
        if daemon is not None and daemon.proc is not None and daemon.proc.returncode is None:
            await daemon.stop()
        await pg.close()
        shutil.rmtree(state, ignore_errors=True)


DATABASE_WAIT_S = 15  # the test's start-up deadline (DISPATCHER_DATABASE_WAIT_S)


async def _attempt_histogram(url: str) -> dict[int, int]:
    rows = await fetch(url, "SELECT attempt, count(*) AS n FROM dispatcher.jobs GROUP BY attempt")
    return {r["attempt"]: r["n"] for r in rows}


async def _status_is(daemon: DaemonProcess, path: str, status: int) -> bool:
    return await http_status(f"{daemon.base_url}{path}") == status


async def test_database_unreachable_at_start_backs_off_then_exits_with_one_line(
    spawn: Spawn,
) -> None:
    closed = free_port()  # nothing listens here
    env = {
        "DISPATCHER_DATABASE_URL": f"postgresql://postgres:hunter2@127.0.0.1:{closed}/postgres",
        "DISPATCHER_DATABASE_WAIT_S": str(DATABASE_WAIT_S),
    }
    started = time.monotonic()
    daemon = await spawn(env, wait_ready=False)
    assert daemon.proc is not None
    process = psutil.Process(daemon.proc.pid)
    cpu_s = 0.0
    while daemon.proc.returncode is None and time.monotonic() - started < DATABASE_WAIT_S + 30:
        try:
            times = process.cpu_times()
            cpu_s = times.user + times.system
        except psutil.NoSuchProcess:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(daemon.proc.wait(), 1.0)
    code = await daemon.wait(timeout_s=5)
    elapsed = time.monotonic() - started
    log = daemon.log_text()
    print(f"\nunreachable database: exit {code} after {elapsed:.1f} s, CPU {cpu_s:.2f} s")
    assert code == 1, log[-2000:]
    assert "hunter2" not in log  # the password never reaches the log
    # the start-up deadline, plus interpreter start and exit
    assert DATABASE_WAIT_S - 1 <= elapsed <= DATABASE_WAIT_S + 15, elapsed
    assert cpu_s < 10, f"{cpu_s:.1f} s of CPU while waiting: it spins"
    retries = [
        json.loads(line)
        for line in log.splitlines()
        if line.startswith("{") and "database not reachable yet" in line
    ]
    # logged at most every 5 s, with the cause, while backing off (0.2 s doubling to 5 s)
    assert 2 <= len(retries) <= DATABASE_WAIT_S / 5 + 2, len(retries)
    assert all(
        "Connect call failed" in r["message"] or "refused" in r["message"].lower() for r in retries
    ), retries[0]
    last = [line for line in log.splitlines() if line.strip()][-1]
    assert re.fullmatch(
        rf"dispatcher: database postgresql://postgres:\*+@127.0.0.1:{closed}/postgres not "
        rf"reachable after {DATABASE_WAIT_S:.0f} s \(.+\); check "
        r"DISPATCHER_DATABASE_URL, or unset it to use the embedded database",
        last,
    ), last


async def test_pool_exhaustion_burst_accepts_or_refuses_cleanly_and_loses_nothing(
    db_url: str, spawn: Spawn
) -> None:
    await create_effects_table(db_url)
    env = daemon_env(db_url, DISPATCHER_DB_POOL_SIZE="2")
    daemon = await spawn(env)
    n = 500
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=60)
    ) as s:

        async def post(i: int) -> tuple[int, str, str]:
            async with s.post(
                f"{daemon.base_url}/v1/jobs",
                json={"handler": "record"},
                headers={"Idempotency-Key": f"pool-{i}"},
            ) as r:
                return r.status, r.content_type, await r.text()

        answers = await asyncio.gather(*(post(i) for i in range(n)))
    by_status: dict[int, int] = {}
    for status, _, _ in answers:
        by_status[status] = by_status.get(status, 0) + 1
    print(f"\n{n} concurrent POSTs on a pool of 2: {by_status}")
    for status, content_type, text in answers:
        assert status in (202, 503), (status, text)
        if status == 503:
            assert content_type == "application/problem+json", text
    accepted = {json.loads(text)["key"] for status, _, text in answers if status == 202}
    await until_job_states(db_url, {"succeeded": len(accepted)}, timeout_s=60)
    stored = await fetchval(db_url, "SELECT array_agg(key) FROM dispatcher.jobs")
    assert set(stored) == accepted  # nothing lost, nothing a 503 claimed to refuse was kept
    effects = await effects_per_key(db_url)
    assert set(effects) == accepted and max(effects.values()) == 1
    assert await daemon.stop() == 0
    assert "unhandled error" not in daemon.log_text(), await states(db_url)
