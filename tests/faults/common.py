"""Helpers shared by the fault-injection tests: daemon environment, intake over HTTP, database
reads, and a private embedded PostgreSQL that a test may stop and start at will."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tests.harness import LOOPBACK_ENV

BASE_ENV = {
    **LOOPBACK_ENV,
    "DISPATCHER_LEASE_S": "2",
    "DISPATCHER_DRAIN_TIMEOUT_S": "5",
}
RECORD_HANDLER = {
    "DISPATCHER_HANDLERS__RECORD__KIND": "python",
    "DISPATCHER_HANDLERS__RECORD__FUNCTION": "tests.faults.handlers:record_effect",
}
EFFECTS_TABLE = """
CREATE TABLE fault_effects (
    job_key  text NOT NULL {unique},
    instance text NOT NULL,
    inflight integer NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
)"""


def daemon_env(db_url: str, **extra: str) -> dict[str, str]:
    return {"DISPATCHER_DATABASE_URL": db_url, **BASE_ENV, **RECORD_HANDLER, **extra}


async def create_effects_table(db_url: str, *, unique: bool = False) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(EFFECTS_TABLE.format(unique="UNIQUE" if unique else ""))
    finally:
        await conn.close()


async def fetch(db_url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def fetchval(db_url: str, sql: str, *args: Any) -> Any:
    rows = await fetch(db_url, sql, *args)
    return rows[0][0] if rows else None


async def states(db_url: str) -> dict[str, int]:
    rows = await fetch(db_url, "SELECT state, count(*) AS n FROM dispatcher.jobs GROUP BY state")
    return {r["state"]: r["n"] for r in rows}


async def all_in(db_url: str, expected: dict[str, int]) -> bool:
    return await states(db_url) == expected


async def effects_per_key(db_url: str) -> Counter[str]:
    rows = await fetch(db_url, "SELECT job_key FROM fault_effects")
    return Counter(r["job_key"] for r in rows)


async def post_job(base_url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{base_url}/v1/jobs", json=body, headers={"Idempotency-Key": key}) as r,
    ):
        assert r.status == 202, await r.text()
        return await r.json()  # type: ignore[no-any-return]


async def post_batch(base_url: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """POST /v1/jobs/batch in chunks of 1,000; every item must be accepted."""
    results: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as s:
        for start in range(0, len(jobs), 1000):
            chunk = jobs[start : start + 1000]
            async with s.post(f"{base_url}/v1/jobs/batch", json={"jobs": chunk}) as r:
                assert r.status == 200, await r.text()
                body = await r.json()
            results += body["results"]
    assert {r["status"] for r in results} == {"accepted"}, results[:3]
    return results


async def http_status(url: str) -> int | None:
    """The status of GET `url`, or None when nothing answers."""
    try:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
            return r.status
    except (aiohttp.ClientError, TimeoutError):
        return None


class PrivatePostgres:
    """An embedded PostgreSQL owned by one test, so the test may stop and restart it without
    touching the server every other test shares. Stop/start go through the embedded server's
    own pg_ctl, as the server user, with the options it starts with (Unix socket only)."""

    def __init__(self, state_dir: Path):
        from dispatcher.db.embedded import EmbeddedPostgres

        self._embedded = EmbeddedPostgres(state_dir)
        self.url = ""

    async def start(self) -> str:
        self.url = await asyncio.to_thread(self._embedded.start)
        return self.url

    async def stop_server(self) -> None:
        """Fast shutdown: every client connection is terminated, as in a real restart."""
        await asyncio.to_thread(self._embedded._pg_ctl, "stop", "-w", "-m", "fast")

    async def start_server(self) -> None:
        """Start again, same directory and socket; this test still owns the server."""
        args = self._embedded._start_args()
        await asyncio.to_thread(self._embedded._pg_ctl, "start", "-w", *args)

    async def close(self) -> None:
        await asyncio.to_thread(self._embedded.stop)
