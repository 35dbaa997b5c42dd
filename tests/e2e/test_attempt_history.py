"""The attempt history through real daemons (`dispatcher run` child processes) and loopback
targets: GET /v1/jobs/{id}/attempts and `dispatcher jobs show` list every ended attempt, newest
first, with its outcome, reason, owner, HTTP status, latency and excerpt, including the attempt
a killed daemon lost (lease_expired) and the one a drain handed back (released)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from tests.harness import (
    LOOPBACK_ENV,
    DaemonProcess,
    Target,
    cli,
    job_changes,
    serve_target,
)
from tests.harness.fixtures import Spawn

ENV = {
    **LOOPBACK_ENV,
    "DISPATCHER_QUEUES__DEFAULT__BACKOFF_BASE_S": "0.05",
    "DISPATCHER_QUEUES__DEFAULT__BACKOFF_CAP_S": "0.1",
}


@pytest.fixture
def spawn(spawn: Spawn, db_url: str) -> Callable[..., Awaitable[DaemonProcess]]:
    """The shared `spawn`, on the test database: `await spawn(**extra_env)`."""
    return lambda **extra: spawn({"DISPATCHER_DATABASE_URL": db_url, **ENV, **extra})


def scripted(*replies: tuple[int, str]) -> Target:
    """A target answering the n-th request for a key with replies[n-1] (the last repeats)."""

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        status, body = replies[min(count, len(replies)) - 1]
        return web.Response(status=status, text=body)

    return Target(respond=respond)


async def post(base_url: str, key: str, body: dict[str, Any]) -> int:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{base_url}/v1/jobs", json=body, headers={"Idempotency-Key": key}) as r,
    ):
        assert r.status == 202, await r.text()
        return int((await r.json())["id"])


async def get(base_url: str, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{base_url}{path}") as r:
        return r.status, await r.json(content_type=None)


async def wait_state(db_url: str, job_id: int, state: str) -> None:
    async def reached(conn: asyncpg.Connection) -> bool:
        return (
            await conn.fetchval("SELECT state FROM dispatcher.jobs WHERE id = $1", job_id) == state
        )

    async with job_changes(db_url) as jobs:
        await jobs.until(reached, timeout_s=30, what=f"job {job_id} {state}")


async def test_the_api_lists_every_attempt_newest_first_and_pages(
    db_url: str, spawn: Spawn
) -> None:
    target = scripted((500, "boom"), (503, ""), (200, '{"ok":true}'))
    async with serve_target(target):
        daemon = await spawn()
        job_id = await post(
            daemon.base_url, "flaky", {"handler": "http", "target": {"url": target.url}}
        )
        waiting = await post(
            daemon.base_url,
            "later",
            {"handler": "http", "target": {"url": target.url}, "due_at": "2031-01-01T00:00:00Z"},
        )
        await wait_state(db_url, job_id, "succeeded")

        status, page = await get(daemon.base_url, f"/v1/jobs/{job_id}/attempts")
        assert status == 200, page
        items = page["items"]
        assert [(a["attempt"], a["outcome"], a["reason"], a["http_status"]) for a in items] == [
            (3, "succeeded", None, 200),
            (2, "retried", "rate_limited", 503),
            (1, "retried", "transient", 500),
        ]
        assert [a["excerpt"] for a in items] == ['{"ok":true}', "HTTP 503", "HTTP 500: boom"]
        assert page["job_id"] == job_id and page["next_cursor"] is None
        owners = {a["owner"] for a in items}
        assert len(owners) == 1 and f":{daemon.proc.pid}:" in owners.pop()  # type: ignore[union-attr]
        for a in items:
            assert 0 < a["latency_s"] < 30, a
            assert a["started_at"] <= a["finished_at"], a

        status, first = await get(daemon.base_url, f"/v1/jobs/{job_id}/attempts?limit=2")
        assert [a["attempt"] for a in first["items"]] == [3, 2] and first["next_cursor"]
        status, rest = await get(
            daemon.base_url, f"/v1/jobs/{job_id}/attempts?limit=2&cursor={first['next_cursor']}"
        )
        assert ([a["attempt"] for a in rest["items"]], rest["next_cursor"]) == ([1], None)
        # a page that ends on the success (kept on the job's state row, migration 062) leads on
        # to the attempts before it
        status, top = await get(daemon.base_url, f"/v1/jobs/{job_id}/attempts?limit=1")
        assert [a["outcome"] for a in top["items"]] == ["succeeded"] and top["next_cursor"]
        status, after = await get(
            daemon.base_url, f"/v1/jobs/{job_id}/attempts?limit=1&cursor={top['next_cursor']}"
        )
        assert (status, [a["attempt"] for a in after["items"]]) == (200, [2])

        # a job never attempted has an empty history; an unknown one is a 404 problem
        assert await get(daemon.base_url, f"/v1/jobs/{waiting}/attempts") == (
            200,
            {"job_id": waiting, "items": [], "next_cursor": None},
        )
        for path, code, detail in (
            ("/v1/jobs/999999/attempts", 404, "no job 999999"),
            (f"/v1/jobs/{job_id}/attempts?limit=0", 422, "limit: an integer from 1 to 1000"),
            (f"/v1/jobs/{job_id}/attempts?cursor=x", 422, "cursor: pass the next_cursor"),
            (f"/v1/jobs/{job_id}/attempts?state=dead", 422, "state: not a parameter here"),
        ):
            status, problem = await get(daemon.base_url, path)
            assert (status, problem["status"]) == (code, code), (path, problem)
            assert problem["detail"].startswith(detail), (path, problem)
        assert await daemon.stop() == 0


async def test_a_killed_daemons_attempt_is_lease_expired_and_a_drained_one_released(
    db_url: str, spawn: Spawn
) -> None:
    hold = asyncio.Event()

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        if count == 1:  # the first request of each job hangs until the test ends
            await hold.wait()
        return web.Response(status=204)

    target = Target(respond=respond)
    try:
        async with serve_target(target):
            job = {"handler": "http", "target": {"url": target.url, "timeout_s": 60}}
            first = await spawn(DISPATCHER_LEASE_S="2")
            killed = await post(first.base_url, "killed", job)
            await target.wait_for(lambda t: len(t.requests) == 1, what="the first request")
            first.signal(signal.SIGKILL)
            await first.wait()

            # a second daemon rescues the job once its lease has expired, and runs it again
            second = await spawn(DISPATCHER_LEASE_S="2", DISPATCHER_DRAIN_TIMEOUT_S="0.5")
            await wait_state(db_url, killed, "succeeded")
            drained = await post(second.base_url, "drained", job)
            await target.wait_for(lambda t: len(t.requests) == 3, what="the drained job's request")
            assert await second.stop() == 0  # its drain hands the hanging attempt back

            third = await spawn()
            await wait_state(db_url, drained, "succeeded")
            _, lost = await get(third.base_url, f"/v1/jobs/{killed}/attempts")
            _, handed_back = await get(third.base_url, f"/v1/jobs/{drained}/attempts")
            assert await third.stop() == 0
    finally:
        hold.set()

    def summary(page: dict[str, Any]) -> list[tuple[int, str, str]]:
        return [(a["attempt"], a["outcome"], a["owner"].split(":")[1]) for a in page["items"]]

    pids = [str(d.proc.pid) for d in (first, second, third)]  # type: ignore[union-attr]
    assert summary(lost) == [(2, "succeeded", pids[1]), (1, "lease_expired", pids[0])]
    assert lost["items"][1]["excerpt"].startswith("lease of ")
    # the drained attempt did not count: the next one carries its number again
    assert summary(handed_back) == [(1, "succeeded", pids[2]), (1, "released", pids[1])]


async def test_jobs_show_prints_the_attempt_history(
    db_url: str, spawn: Spawn, tmp_path: Path
) -> None:
    target = scripted((500, "boom\n  on two lines"), (200, "done"))
    async with serve_target(target):
        daemon = await spawn()
        job_id = await post(
            daemon.base_url, "shown", {"handler": "http", "target": {"url": target.url}}
        )
        await wait_state(db_url, job_id, "succeeded")
        assert await daemon.stop() == 0
    env = {"DISPATCHER_DATABASE_URL": db_url}

    text = await cli("jobs", "show", str(job_id), cwd=tmp_path, env=env)
    assert text.code == 0, text.stderr
    lines = text.stdout.splitlines()
    header = lines.index("attempts, newest first:")
    assert lines[header + 1].split() == [
        "#",
        "OUTCOME",
        "FINISHED",
        "HTTP",
        "LATENCY",
        "REASON:",
        "EXCERPT",
    ]
    newest, oldest = lines[header + 2], lines[header + 3]
    assert newest.split()[:2] == ["2", "succeeded"] and newest.split()[3] == "200", newest
    assert newest.endswith("done"), newest
    assert oldest.split()[:2] == ["1", "retried"] and oldest.split()[3] == "500", oldest
    assert oldest.endswith("transient: HTTP 500: boom on two lines"), oldest

    as_json = await cli("jobs", "show", str(job_id), "--json", cwd=tmp_path, env=env)
    view = json.loads(as_json.stdout)
    assert [(a["attempt"], a["outcome"], a["http_status"]) for a in view["attempts"]] == [
        (2, "succeeded", 200),
        (1, "retried", 500),
    ]
    one = await cli("jobs", "show", str(job_id), "--json", "--attempts", "1", cwd=tmp_path, env=env)
    assert [a["attempt"] for a in json.loads(one.stdout)["attempts"]] == [2]
    none = await cli(
        "jobs", "show", str(job_id), "--json", "--attempts", "0", cwd=tmp_path, env=env
    )
    assert "attempts" not in json.loads(none.stdout)
    bad = await cli("jobs", "show", str(job_id), "--attempts", "-1", cwd=tmp_path, env=env)
    assert bad.code == 2
    assert "argument --attempts: '-1': expected an integer from 0 to 1000" in bad.stderr
