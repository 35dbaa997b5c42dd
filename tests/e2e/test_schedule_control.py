"""Schedule control through the public doors, on real daemons and the real CLI: pause and resume
over HTTP and from the command line (persisted, seen by every daemon on the database, kept
across a restart), dry runs of trigger and catch-up that create nothing, and bad input refused
with a problem that names the fix."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dispatcher.core.rfc3339 import format as rfc3339
from tests.faults.common import fetchval
from tests.harness import DaemonProcess, cli
from tests.harness.fixtures import Spawn

CONFIG = """
[queues.default]

[handlers.noop]
kind = "python"
function = "tests.badinput.handlers:noop"

[[schedules]]
name = "nightly"
cron = "0 2 * * *"
handler = "noop"
fanout = { ranges = 3 }
overlap = "allow"
"""


def nightly_before(now: datetime) -> datetime:
    """The latest 02:00 UTC at least a day before `now` (never within the misfire grace)."""
    day = (now - timedelta(days=1)).date()
    return datetime(day.year, day.month, day.day, 2, tzinfo=UTC)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "schedules.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
async def daemons(db_url: str, config: Path, spawn: Spawn) -> list[DaemonProcess]:
    """Two daemons on one database."""
    env = {"DISPATCHER_DATABASE_URL": db_url, "DISPATCHER_CONFIG": str(config)}
    return [await spawn(env) for _ in range(2)]


async def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, base + path, json=body) as r:
        return r.status, await r.json(content_type=None)


async def schedule_view(base: str) -> dict[str, Any]:
    status, body = await call(base, "GET", "/v1/schedules")
    assert status == 200, body
    (view,) = body["schedules"]
    return view  # type: ignore[no-any-return]


async def runs(db_url: str) -> int:
    """Runs created by requests (a daemon started just before 02:00 UTC may fire one itself)."""
    return await fetchval(  # type: ignore[no-any-return]
        db_url, "SELECT count(*) FROM dispatcher.runs WHERE via <> 'cron'"
    )


async def test_pause_resume_and_dry_runs_over_http_on_two_daemons(
    db_url: str, daemons: list[DaemonProcess]
) -> None:
    a, b = (d.base_url for d in daemons)
    status, view = await call(a, "POST", "/v1/schedules/nightly/pause")
    assert status == 200, view
    assert (view["name"], view["paused"], view["next_fire_at"]) == ("nightly", True, None)
    assert view["paused_at"] is not None
    seen = await schedule_view(b)  # the other daemon reads the same state
    assert (seen["paused"], seen["paused_at"]) == (True, view["paused_at"])
    status, again = await call(b, "POST", "/v1/schedules/nightly/pause")
    assert (status, again["paused_at"]) == (200, view["paused_at"])  # idempotent: same start

    period = nightly_before(datetime.now(UTC))
    first = rfc3339(period - timedelta(days=2))
    status, dry = await call(
        a,
        "POST",
        "/v1/schedules/nightly/trigger",
        {"period_start": rfc3339(period), "dry_run": True},
    )
    assert (status, dry) == (
        200,
        {
            "run_key": f"nightly:{rfc3339(period)}",
            "period_start": rfc3339(period),
            "outcome": "would_create",
            "units": 3,
            "dry_run": True,
        },
    )
    assert await runs(db_url) == 0
    # an explicit trigger runs while paused (an operator's request)
    status, receipt = await call(
        b, "POST", "/v1/schedules/nightly/trigger", {"period_start": rfc3339(period)}
    )
    assert (status, receipt["outcome"], receipt["units"]["total"]) == (202, "created", 3)

    body = {"from": first, "to": rfc3339(period), "dry_run": True}
    status, planned = await call(a, "POST", "/v1/schedules/nightly/catch-up", body)
    assert status == 200, planned
    assert [r["outcome"] for r in planned["runs"]] == ["would_create", "would_create", "existing"]
    assert (planned["would_create"], planned["existing"], planned["dry_run"]) == (2, 1, True)
    assert await runs(db_url) == 1

    status, caught = await call(
        a, "POST", "/v1/schedules/nightly/catch-up", {"from": first, "to": rfc3339(period)}
    )
    assert status == 202, caught
    assert [r["outcome"] for r in caught["runs"]] == ["created", "created", "existing"]
    assert (caught["created"], caught["existing"]) == (2, 1)
    assert await runs(db_url) == 3
    status, repeated = await call(
        b, "POST", "/v1/schedules/nightly/catch-up", {"from": first, "to": rfc3339(period)}
    )
    assert (status, repeated["created"], repeated["existing"]) == (200, 0, 3)

    # a restart keeps the pause (it lives in the database)
    assert await daemons[0].stop() == 0
    await daemons[0].start()
    assert (await schedule_view(a))["paused"] is True

    status, view = await call(b, "POST", "/v1/schedules/nightly/resume")
    assert (status, view["paused"], view["paused_at"]) == (200, False, None)
    assert view["next_fire_at"] is not None
    assert (await schedule_view(a))["paused"] is False
    assert (await call(a, "POST", "/v1/schedules/nightly/resume"))[0] == 200  # idempotent


BAD_REQUESTS = [
    ("/v1/schedules/other/pause", None, 404, "no schedule 'other'"),
    ("/v1/schedules/other/resume", None, 404, "no schedule 'other'"),
    ("/v1/schedules/other/catch-up", {"from": "x", "to": "y"}, 404, "no schedule 'other'"),
    ("/v1/schedules/nightly/trigger", {"period_start": "PERIOD", "dry_run": "yes"}, 422,
     "dry_run: must be true or false"),
    ("/v1/schedules/nightly/trigger", {"period_start": "PERIOD", "dry": True}, 422,
     'body must be {"period_start"'),
    ("/v1/schedules/nightly/catch-up", {"from": "PERIOD"}, 422, 'body must be {"from"'),
    ("/v1/schedules/nightly/catch-up", {"from": "PERIOD", "to": 5}, 422,
     "to: must be an RFC 3339 timestamp string"),
    ("/v1/schedules/nightly/catch-up", {"from": "PERIOD", "to": "2026-13-01T00:00:00Z"},
     422, "to: '2026-13-01T00:00:00Z' is no such date or time"),
    ("/v1/schedules/nightly/catch-up", {"from": "PERIOD", "to": "2999-01-01T02:00:00Z",
     "dry_run": True}, 422, "ends in the future"),
    ("/v1/schedules/nightly/catch-up", {"from": "PERIOD", "to": "2000-01-01T02:00:00Z"},
     422, "before it starts"),
    ("/v1/schedules/nightly/trigger", {"period_start": "2020-01-01T02:30:00Z",
     "dry_run": True}, 422, "not a period start"),
]  # fmt: skip


async def test_bad_schedule_requests_are_refused_and_change_nothing(
    db_url: str, daemons: list[DaemonProcess]
) -> None:
    period = rfc3339(nightly_before(datetime.now(UTC)))
    for path, body, status, detail in BAD_REQUESTS:
        if isinstance(body, dict):
            body = {k: period if v == "PERIOD" else v for k, v in body.items()}
        got, problem = await call(daemons[0].base_url, "POST", path, body)
        assert (got, problem["status"]) == (status, status), (path, body, problem)
        assert detail in problem["detail"], (path, body, problem)
    assert await runs(db_url) == 0
    assert (
        await fetchval(db_url, "SELECT count(*) FROM dispatcher.schedule_state WHERE paused") == 0
    )


async def test_the_cli_pauses_what_the_running_daemon_honours_and_dry_runs_create_nothing(
    tmp_path: Path, db_url: str, config: Path, spawn: Spawn
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, "DISPATCHER_CONFIG": str(config)}
    daemon = await spawn(env)
    try:
        paused = await cli("schedules", "pause", "nightly", "--json", cwd=tmp_path, env=env)
        assert paused.code == 0, paused.stderr
        assert json.loads(paused.stdout)["paused"] is True
        assert (await schedule_view(daemon.base_url))["paused"] is True

        listing = await cli("schedules", cwd=tmp_path, env=env)
        assert listing.code == 0, listing.stderr
        assert "  PAUSED since " in listing.stdout
        assert "dispatcher schedules resume nightly" in listing.stdout

        period = nightly_before(datetime.now(UTC))
        window = ["--from", rfc3339(period - timedelta(days=1)), "--to", rfc3339(period)]
        dry = await cli("catch-up", "nightly", *window, "--dry-run", cwd=tmp_path, env=env)
        assert dry.code == 0, dry.stderr
        assert dry.stdout.splitlines() == [
            f"nightly:{rfc3339(period - timedelta(days=1))}  would_create units=3",
            f"nightly:{rfc3339(period)}  would_create units=3",
            "dry run: 2 run(s) would be created, 0 exist",
        ]
        as_json = await cli(
            "catch-up", "nightly", *window, "--dry-run", "--json", cwd=tmp_path, env=env
        )
        assert [p["outcome"] for p in json.loads(as_json.stdout)] == ["would_create"] * 2
        assert await runs(db_url) == 0

        # trigger: one explicit period, while paused too; a bad period is a usage error
        trigger = ["schedules", "trigger", "nightly", "--period", rfc3339(period)]
        would = await cli(*trigger, "--dry-run", cwd=tmp_path, env=env)
        assert (would.code, would.stdout.strip()) == (
            0,
            f"nightly:{rfc3339(period)}  would_create",
        ), would.stderr
        bad = await cli(*trigger[:3], "--period", "02:00", cwd=tmp_path, env=env)
        assert bad.code == 2, bad.stderr
        assert bad.stderr.splitlines()[-1].startswith("dispatcher: --period: "), bad.stderr
        assert await runs(db_url) == 0
        made = await cli(*trigger, "--json", cwd=tmp_path, env=env)
        assert (made.code, json.loads(made.stdout)["outcome"]) == (0, "created"), made.stderr
        again = await cli(*trigger, cwd=tmp_path, env=env)
        assert again.stdout.strip() == f"nightly:{rfc3339(period)}  existing"
        assert await runs(db_url) == 1

        resumed = await cli("schedules", "resume", "nightly", cwd=tmp_path, env=env)
        assert resumed.code == 0, resumed.stderr
        assert "PAUSED" not in resumed.stdout and resumed.stdout.startswith("nightly  cron=")
        assert (await schedule_view(daemon.base_url))["paused"] is False

        unknown = await cli("schedules", "pause", "other", cwd=tmp_path, env=env)
        assert unknown.code == 1  # not found, as for a job or a queue (not a usage error)
        assert unknown.stderr.splitlines()[-1] == (
            "dispatcher: no schedule 'other' (known: nightly)"
        )
        missing = await cli("schedules", "pause", cwd=tmp_path, env=env)
        assert missing.code == 2 and "the following arguments are required: name" in missing.stderr
        assert (
            await fetchval(db_url, "SELECT count(*) FROM dispatcher.schedule_state WHERE paused")
            == 0
        )
    finally:
        assert await daemon.stop() == 0


async def test_the_openapi_document_describes_the_schedule_routes(
    daemons: list[DaemonProcess],
) -> None:
    status, document = await call(daemons[0].base_url, "GET", "/openapi.json")
    assert status == 200
    for route in ("pause", "resume", "catch-up", "trigger"):
        operation = document["paths"][f"/v1/schedules/{{name}}/{route}"]["post"]
        assert {"200", "404"} <= set(operation["responses"]), route
    trigger = document["paths"]["/v1/schedules/{name}/trigger"]["post"]
    schema = trigger["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["dry_run"] == {"type": "boolean", "default": False}
