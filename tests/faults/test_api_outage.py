"""A database outage under a running daemon, seen from the API: every route that needs the
database answers 503 with `Retry-After` and a problem saying so (never a 500 or a hang), and
the same requests succeed once the database is back. The daemon reaches PostgreSQL through a
loopback proxy the test cuts: connections dropped, new ones refused."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from tests.faults.common import daemon_env
from tests.harness import wait_until
from tests.harness.fixtures import Spawn
from tests.outage_proxy import outage_proxy

PROBLEM = "application/problem+json"
CONFIG = """
[[schedules]]
name = "nightly"
cron = "0 3 * * *"
handler = "record"
"""


def job(**fields: Any) -> dict[str, Any]:
    return {"handler": "record", "due_at": "2099-01-01T00:00:00Z", **fields}


async def test_database_outage_is_503_with_retry_after_then_recovers(
    db_url: str, spawn: Spawn, tmp_path: Path
) -> None:
    config = tmp_path / "dispatcher.toml"
    config.write_text(CONFIG)
    yesterday = datetime.now(UTC) - timedelta(days=1)
    period = yesterday.replace(hour=3, minute=0, second=0, microsecond=0).isoformat()
    async with (
        outage_proxy(db_url) as proxy,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s,
    ):
        daemon = await spawn(daemon_env(proxy.url, DISPATCHER_CONFIG=str(config)))
        base = daemon.base_url

        async def call(
            method: str, path: str, body: Any = None, key: str = ""
        ) -> tuple[int, str, str | None, str]:
            headers = {"Idempotency-Key": key} if key else {}
            async with s.request(method, base + path, json=body, headers=headers) as r:
                return r.status, r.content_type, r.headers.get("Retry-After"), await r.text()

        status, _, _, text = await call("POST", "/v1/jobs", job(), key="outage-0")
        assert status == 202, text
        job_id = int(json.loads(text)["id"])

        await proxy.cut()
        requests: dict[str, tuple[str, str, Any, str]] = {
            "post": ("POST", "/v1/jobs", job(), "outage-1"),
            "batch": ("POST", "/v1/jobs/batch", {"jobs": [job(idempotency_key="b-1")] * 2}, ""),
            "get": ("GET", f"/v1/jobs/{job_id}", None, ""),
            "list": ("GET", "/v1/jobs?limit=1000", None, ""),
            "retry": ("POST", f"/v1/jobs/{job_id}/retry", None, ""),
            "cancel": ("POST", f"/v1/jobs/{job_id}/cancel", None, ""),
            "schedules": ("GET", "/v1/schedules", None, ""),
            "trigger": ("POST", "/v1/schedules/nightly/trigger", {"period_start": period}, ""),
        }
        for name, (method, path, body, key) in requests.items():
            status, content_type, retry_after, text = await call(method, path, body, key)
            assert (status, content_type) == (503, PROBLEM), (name, status, text)
            assert retry_after is not None and retry_after.isdigit(), (name, retry_after)
            if name != "trigger":  # a trigger names the run that was not created
                assert "database is unavailable" in text, (name, text)

        # single requests arriving together share a write: every one of them learns it failed
        async with asyncio.timeout(15):
            answers = await asyncio.gather(
                *(call("POST", "/v1/jobs", job(), key=f"group-{i}") for i in range(30))
            )
        assert {a[:2] for a in answers} == {(503, PROBLEM)}, answers[0]

        await proxy.restore()

        async def accepted() -> bool:
            return (await call("POST", "/v1/jobs", job(), key="outage-1"))[0] == 202

        await wait_until(accepted, timeout_s=20, what="202 once the database is back")
        status, _, _, text = await call("GET", f"/v1/jobs/{job_id}")
        assert status == 200, text
    # each refusal is one warning line; nothing of the API logs an error (or a traceback)
    api_errors = [
        entry
        for line in daemon.log_text().splitlines()
        if line.startswith("{")
        and (entry := json.loads(line))["logger"] in ("dispatcher.api.app", "aiohttp.server")
        and entry["level"] not in ("debug", "info", "warning")
    ]
    assert not api_errors, api_errors[:3]
