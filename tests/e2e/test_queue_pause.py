"""Pausing a queue, end to end on real daemon processes sharing one database: a pause through one
daemon's API stops every daemon's claims at once and survives restarts; intake keeps accepting
and the due-scan keeps moving due jobs to `ready`; running attempts finish; `dispatcher queues
resume` (the CLI, straight on the database) starts the backlog again. Plus the overview
(`GET /v1/queues`, `dispatcher queues --json`), the metric, and unknown names."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tests.harness import (
    LOOPBACK_ENV,
    DaemonProcess,
    Target,
    cli,
    job_changes,
    serve_target,
    wait_until,
)
from tests.harness.fixtures import Spawn

QUEUE = "work"


def daemon_env(db_url: str) -> dict[str, str]:
    return {
        "DISPATCHER_DATABASE_URL": db_url,
        **LOOPBACK_ENV,
        "DISPATCHER_DRAIN_TIMEOUT_S": "10",
        # a few at a time, so work is still in flight and waiting when the pause lands
        f"DISPATCHER_QUEUES__{QUEUE.upper()}__MAX_INFLIGHT": "3",
        f"DISPATCHER_QUEUES__{QUEUE.upper()}__CLAIM_BATCH": "3",
    }


async def restart(daemon: DaemonProcess) -> None:
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait(timeout_s=60) == 0, daemon.log_text()[-3000:]
    await daemon.start()


async def call(method: str, url: str, body: Any = None, **headers: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url, json=body, headers=headers) as r,
    ):
        return r.status, await r.json(content_type=None)


async def enqueue(daemon: DaemonProcess, key: str, url: str, **fields: Any) -> dict[str, Any]:
    body = {"handler": "http", "target": {"url": url}, "queue": QUEUE, **fields}
    status, doc = await call("POST", f"{daemon.base_url}/v1/jobs", body, **{"Idempotency-Key": key})
    assert status == 202, doc
    return doc  # type: ignore[no-any-return]


async def states(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT state, count(*)::int AS n FROM dispatcher.jobs WHERE queue = $1 GROUP BY 1", QUEUE
    )
    return {r["state"]: r["n"] for r in rows}


async def latest_start(conn: asyncpg.Connection) -> datetime:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT max(started_at) FROM dispatcher.jobs WHERE queue = $1", QUEUE
    )


async def metric(daemon: DaemonProcess, line_start: str) -> str | None:
    async with aiohttp.ClientSession() as s, s.get(f"{daemon.base_url}/metrics") as r:
        text = await r.text()
    return next((ln.split()[-1] for ln in text.splitlines() if ln.startswith(line_start)), None)


async def test_a_pause_holds_on_every_daemon_at_once_and_across_restarts(
    db_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    env = daemon_env(db_url)
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target(delay_s=0.05)) as target, job_changes(db_url) as jobs:
        a, b = [await spawn(env) for _ in range(2)]
        for i in range(60):
            await enqueue(a, f"before-{i}", target.url)
        await target.wait_for(lambda t: len(t.requests) >= 6, what="work under way on both daemons")

        status, view = await call("POST", f"{b.base_url}/v1/queues/{QUEUE}/pause")
        assert status == 200, view
        assert (view["name"], view["paused"]) == (QUEUE, True)
        assert view["paused_at"] is not None
        paused_by_then = await conn.fetchval("SELECT now()")

        # intake goes on: due now (ready at once) and due soon (the due-scan moves them)
        for i in range(10):
            accepted = await enqueue(a, f"during-{i}", target.url)
            assert accepted["state"] == "ready"
        soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
        for i in range(5):
            accepted = await enqueue(b, f"soon-{i}", target.url, due_at=soon)
            assert accepted["state"] == "scheduled"

        async def settled(c: asyncpg.Connection) -> bool:  # running ones finished; soon-* moved
            now = await states(c)
            return now.get("running", 0) == 0 and now.get("scheduled", 0) == 0

        await jobs.until(settled, timeout_s=20, what="running attempts to finish, soon-* ready")
        counts = await states(conn)
        assert counts.get("ready", 0) >= 15, counts  # the backlog stays visible
        assert counts["ready"] + counts["succeeded"] == 75, counts
        # every daemon stopped claiming when the pause committed: nothing started after it
        assert await latest_start(conn) <= paused_by_then

        for daemon in (a, b):
            status, overview = await call("GET", f"{daemon.base_url}/v1/queues")
            assert status == 200, overview
            work = next(q for q in overview["queues"] if q["name"] == QUEUE)
            assert work["paused"] is True

            async def sample_caught_up(url: str = f"{daemon.base_url}/v1/queues") -> bool:
                # the counts are a sample up to 1 s old (OVERVIEW_MAX_AGE_S); nothing signals
                # its refresh, and a wait woken by the jobs' NOTIFY can come before it
                _, now = await call("GET", url)
                ready = next(q for q in now["queues"] if q["name"] == QUEUE)["jobs"]["ready"]
                return bool(ready == counts["ready"])

            await wait_until(sample_caught_up, timeout_s=5, what="the overview's ready count")
            assert work["limits"]["max_inflight"] == 3
            default = next(q for q in overview["queues"] if q["name"] == "default")
            assert default["paused"] is False

        async def gauge_says_paused() -> bool:  # sampled from the database every 5 s
            return await metric(a, f'dispatcher_queue_paused{{queue="{QUEUE}"}}') == "1.0"

        await wait_until(gauge_says_paused, timeout_s=15, what="the paused gauge")
        assert await metric(a, 'dispatcher_queue_paused{queue="default"}') == "0.0"

        # restarts read the pause from the database: other queues run, this one waits
        await restart(a)
        await restart(b)
        status, job = await call(
            "POST",
            f"{a.base_url}/v1/jobs",
            {"handler": "http", "target": {"url": target.url}},
            **{"Idempotency-Key": "default-after-restart"},
        )
        assert status == 202, job
        await target.wait_for(
            lambda t: "default-after-restart" in t.request_keys(), what="the default queue"
        )
        assert await latest_start(conn) <= paused_by_then

        listed = await cli("queues", "--json", cwd=tmp_path, env=env)
        assert listed.code == 0, listed.stderr
        work = next(q for q in json.loads(listed.stdout)["queues"] if q["name"] == QUEUE)
        assert (work["paused"], work["jobs"]["ready"]) == (True, counts["ready"])

        resumed = await cli("queues", "resume", QUEUE, cwd=tmp_path, env=env)
        assert resumed.code == 0, resumed.stderr
        assert f"queue {QUEUE} resumed" in resumed.stdout

        async def all_done(c: asyncpg.Connection) -> bool:
            return (await states(c)).get("succeeded", 0) == 75

        await jobs.until(all_done, timeout_s=30, what="the backlog to run after the resume")
        keys = [k for k in target.request_keys() if k != "default-after-restart"]
        assert sorted(set(keys)) == sorted(keys)  # each job delivered once
        assert len(keys) == 75
        status, overview = await call("GET", f"{a.base_url}/v1/queues")
        assert next(q for q in overview["queues"] if q["name"] == QUEUE)["paused"] is False
    await conn.close()


async def test_pause_and_resume_are_idempotent_and_an_unknown_queue_is_404(
    db_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    env = daemon_env(db_url)
    daemon = await spawn(env)
    base = f"{daemon.base_url}/v1/queues"
    first = await call("POST", f"{base}/{QUEUE}/pause")
    again = await call("POST", f"{base}/{QUEUE}/pause")
    assert first[0] == again[0] == 200
    assert again[1]["paused_at"] == first[1]["paused_at"]  # paused since the first pause

    for name in ("nope", "NOPE", "a%00b", "x" * 300):
        status, doc = await call("POST", f"{base}/{name}/pause")
        assert status == 404, doc
        assert doc["detail"].endswith("queues: default, work"), doc
        assert doc["queues"] == ["default", "work"]
    status, doc = await call("POST", f"{base}/nope/resume")
    assert (status, doc["queues"]) == (404, ["default", "work"])

    status, doc = await call("POST", f"{base}/{QUEUE}/resume")
    assert (status, doc["paused"], doc["paused_at"]) == (200, False, None)
    status, doc = await call("POST", f"{base}/{QUEUE}/resume")
    assert (status, doc["paused"]) == (200, False)
    await daemon.kill()  # the commands below run with no daemon

    unknown = await cli("queues", "pause", "nope", cwd=tmp_path, env=env)
    assert unknown.code == 1
    # the last line (above it: the audit line of the refused action, dispatcher.operator.audit)
    assert unknown.stderr.splitlines()[-1] == "dispatcher: no queue 'nope'; queues: default, work"
    paused = await cli("queues", "pause", QUEUE, "--json", cwd=tmp_path, env=env)
    assert paused.code == 0, paused.stderr
    assert json.loads(paused.stdout)["paused"] is True
    table = await cli("queues", cwd=tmp_path, env=env)
    assert table.code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["QUEUE", "PAUSED", "SCHEDULED"]
    assert "DISCARDED" in lines[0]
    assert next(ln for ln in lines if ln.startswith(QUEUE)).split()[1] == "yes"
    assert next(ln for ln in lines if ln.startswith("default")).split()[1] == "no"
