"""The real daemon as a child process: accepted jobs survive SIGTERM and a restart, on an external
database and on the embedded one (the README's default path); /readyz tells the truth."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import pytest

from dispatcher.db import schema
from tests.harness import DaemonProcess, daemon_process, get, post, terminate, wait_until

JOB = {
    "handler": "http",
    "target": {"url": "https://hooks.example.com/grants"},
    "payload": {"grant": 17},
    "due_at": "2031-05-31T02:00:00Z",  # far ahead: nothing runs, the intent just waits
}


async def accept_then_restart(env: dict[str, str], unset: tuple[str, ...] = ()) -> None:
    async with daemon_process(env, unset=unset) as first:
        status, accepted = await post(first, "grant-17", JOB)
        assert status == 202, accepted
        assert accepted["state"] == "scheduled"
        await terminate(first)

    async with daemon_process(env, unset=unset) as second:
        status, view = await get(second, f"/v1/jobs/{accepted['id']}")
        assert status == 200, view
        assert (view["key"], view["state"], view["due_at"]) == (
            "grant-17",
            "scheduled",
            accepted["due_at"],
        )
        # idempotency outlives the process too
        status, replay = await post(second, "grant-17", JOB)
        assert (status, replay["id"]) == (202, accepted["id"])
        status, conflict = await post(second, "grant-17", {**JOB, "payload": {"grant": 18}})
        assert status == 409, conflict
        status, listing = await get(second, "/v1/jobs")
        assert [j["id"] for j in listing["items"]] == [accepted["id"]]
        await terminate(second)


async def test_a_job_survives_sigterm_and_restart(db_url: str, tmp_path: Path) -> None:
    await accept_then_restart(
        {"DISPATCHER_DATABASE_URL": db_url, "DISPATCHER_STATE_DIR": str(tmp_path / "state")}
    )
    # the external database was used, not an embedded one
    assert not (tmp_path / "state" / "pgdata").exists()


async def test_embedded_database_keeps_data_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    await accept_then_restart(
        {"DISPATCHER_STATE_DIR": str(state)}, unset=("DISPATCHER_DATABASE_URL",)
    )
    data = state / "pgdata"
    assert (data / "PG_VERSION").exists()
    # the daemon stopped the server it started
    assert not (data / "postmaster.pid").exists()


@pytest.fixture
async def admin(server_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(server_url)
    yield conn
    await conn.close()


async def readiness(daemon: DaemonProcess) -> tuple[int, Any]:
    try:
        return await get(daemon, "/readyz")
    except aiohttp.ClientError as exc:
        return 0, str(exc)


async def test_readyz_reports_database_and_schema(
    db_url: str, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    name = urlsplit(db_url).path.lstrip("/")
    env = {"DISPATCHER_DATABASE_URL": db_url, "DISPATCHER_STATE_DIR": str(tmp_path / "state")}
    async with daemon_process(env) as daemon:
        assert await get(daemon, "/readyz") == (200, {"ready": True, "reason": "ok"})
        db = await asyncpg.connect(db_url)
        latest = schema.latest_version()

        # schema behind this release -> not ready, and the reason says how to fix it
        await db.execute("DELETE FROM dispatcher.migrations WHERE version = $1", latest)
        status, body = await readiness(daemon)
        assert status == 503
        assert body["ready"] is False
        assert "dispatcher migrate" in body["reason"]
        await db.execute(
            "INSERT INTO dispatcher.migrations (version, name) VALUES ($1, 'restored')", latest
        )
        assert (await readiness(daemon))[0] == 200
        await db.close()

        # database refusing connections -> not ready; alive all the same
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
        )

        async def unready() -> bool:
            status, body = await readiness(daemon)
            return status == 503 and body["reason"].startswith("database:")

        await wait_until(unready, timeout_s=30, what="/readyz to report the database")
        assert (await get(daemon, "/healthz"))[0] == 200

        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

        async def ready_again() -> bool:
            return (await readiness(daemon))[0] == 200

        await wait_until(ready_again, timeout_s=30, what="/readyz to recover")
        await terminate(daemon)
