"""Scoped API tokens on a real daemon process: every route of the scope table called with every
token (real job ids, schedule and queue names, so the handlers run): a token with the route's
scope gets past authorization, one without it gets a 403 problem naming the scope; operator
actions are logged with the token's name and no token ever reaches the log. The CLI: check-config
shows names and scopes with the tokens masked; a bad tokens file is one line naming the line."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dispatcher.api.scopes import ROUTE_SCOPES
from tests.harness import DaemonProcess, cli

PROBLEM = "application/problem+json"
# name -> (token, scopes)
TOKENS = {
    "dashboards": ("tok-reader-1a9f0c", {"read"}),
    "ci": ("tok-enqueue-2b8e1d", {"enqueue"}),
    "oncall": ("tok-oncall-3c7d2e", {"read", "operate"}),
    "env-ops": ("tok-env-ops-4d6c3f", {"operate"}),
    "api_tokens_file line 6": ("tok-bare-5e5b4a", {"read", "enqueue", "operate"}),
}
TOKENS_FILE = """# the platform's API tokens
tok-reader-1a9f0c read # dashboards
tok-enqueue-2b8e1d enqueue # ci
tok-oncall-3c7d2e read,operate # oncall

tok-bare-5e5b4a
"""
ENV_TOKENS = "tok-env-ops-4d6c3f operate # env-ops"
CONFIG = """
[handlers.report]
kind = "python"
function = "tests.badinput.handlers:noop"

[[schedules]]
name = "nightly"
cron = "0 3 * * *"
handler = "report"
"""


def job_body(n: int) -> dict[str, Any]:
    return {"handler": "report", "due_at": "2031-01-01T00:00:00Z", "payload": {"n": n}}


@pytest.fixture(scope="module")
def module_daemon_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("tokens")
    (folder / "dispatcher.toml").write_text(CONFIG)
    (folder / "api-tokens").write_text(TOKENS_FILE)
    return {
        "DISPATCHER_CONFIG": str(folder / "dispatcher.toml"),
        "DISPATCHER_API_TOKENS_FILE": str(folder / "api-tokens"),
        "DISPATCHER_API_TOKENS": ENV_TOKENS,
        # wrong tokens on every route, from one address: not what the guessing limit
        # (tests/e2e/test_guessing.py) is for, so it is out of the way here
        "DISPATCHER_AUTH_FAILURE_LIMIT": "100000",
    }


async def call(
    session: aiohttp.ClientSession,
    module_daemon: DaemonProcess,
    method: str,
    path: str,
    token: str | None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any] | str]:
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    async with session.request(method, module_daemon.base_url + path, json=body, headers=sent) as r:
        if r.content_type in (PROBLEM, "application/json"):
            return r.status, await r.json(content_type=None)
        return r.status, await r.text()


def concrete(method: str, route: str, job_id: int, n: int) -> tuple[str, Any, dict[str, str]]:
    """A real call of `route`: a job that exists, the configured schedule and queue."""
    path = route.replace("{id}", str(job_id))
    path = path.replace("{name}", "nightly" if "schedules" in route else "default")
    path = path.replace("{key}", "tenant-a").replace("{action}", "retry")
    yesterday = datetime.now(UTC) - timedelta(days=1)
    period = yesterday.replace(hour=3, minute=0, second=0, microsecond=0).isoformat()
    bodies: dict[str, Any] = {
        "/v1/jobs": job_body(n),
        "/v1/jobs/batch": {"jobs": [{**job_body(n), "idempotency_key": f"batch-{n}"}]},
        "/v1/jobs/{id}/reschedule": {"due_at": "2031-02-01T00:00:00Z"},
        "/v1/schedules/{name}/trigger": {"period_start": period},
        "/v1/schedules/{name}/catch-up": {"from": period, "to": period, "dry_run": True},
        "/v1/jobs/redrive": {"dry_run": True, "all": True},
        "/v1/jobs/discard": {"dry_run": True, "all": True},
        "/v1/jobs/bulk/{action}": {"ids": [job_id], "dry_run": True},
        "/v1/queues/{name}": {"rate_per_s": 50},
        "/v1/queues/{name}/keys/{key}": {"max_inflight": 5},
    }
    headers = {"Idempotency-Key": f"scoped-{n}"} if route == "/v1/jobs" else {}
    return path, bodies.get(route) if method in ("POST", "PATCH", "PUT") else None, headers


def issue_rule(method: str, route: str) -> str:
    """The scope the issue assigns, written independently of the table the daemon uses."""
    if method == "GET":
        return "read"
    return "enqueue" if route in ("/v1/jobs", "/v1/jobs/batch") else "operate"


async def test_every_route_admits_exactly_the_tokens_with_its_scope(
    module_daemon: DaemonProcess,
) -> None:
    async with aiohttp.ClientSession() as s:
        bare = TOKENS["api_tokens_file line 6"][0]
        status, created = await call(
            s, module_daemon, "POST", "/v1/jobs", bare, job_body(0), {"Idempotency-Key": "seed"}
        )
        assert status == 202, created
        assert isinstance(created, dict)
        n = 0
        for method, route in sorted(ROUTE_SCOPES):
            scope = issue_rule(method, route)
            for name, (token, scopes) in TOKENS.items():
                n += 1
                path, body, headers = concrete(method, route, created["id"], n)
                status, answer = await call(s, module_daemon, method, path, token, body, headers)
                where = (method, route, name, status, answer)
                if scope in scopes:
                    assert status not in (401, 403), where
                    assert status < 500, where
                else:
                    assert status == 403, where
                    assert isinstance(answer, dict) and answer["scope"] == scope, where
                    assert f"token {name!r} lacks scope {scope!r}" in answer["detail"], where
                    assert token not in answer["detail"]


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer tok-nobody-0000", "Basic tok-bare-5e5b4a", "Bearer", "Bearer tok-bare-5e5b4"],
)
async def test_a_missing_or_unknown_token_is_401_everywhere(
    module_daemon: DaemonProcess, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    async with aiohttp.ClientSession() as s:
        for method, route in sorted(ROUTE_SCOPES):
            path = route.replace("{id}", "1").replace("{name}", "nightly").replace("{key}", "k")
            async with s.request(method, module_daemon.base_url + path, headers=headers) as r:
                assert (r.status, r.content_type) == (401, PROBLEM), (method, route)
                assert r.headers["WWW-Authenticate"] == 'Bearer realm="dispatcher"'


async def test_operator_actions_are_logged_by_name_and_no_token_is_ever_logged(
    module_daemon: DaemonProcess,
) -> None:
    oncall, reader = TOKENS["oncall"][0], TOKENS["dashboards"][0]
    async with aiohttp.ClientSession() as s:
        status, job = await call(
            s,
            module_daemon,
            "POST",
            "/v1/jobs",
            TOKENS["ci"][0],
            job_body(-1),
            {"Idempotency-Key": "log-1"},
        )
        assert status == 202 and isinstance(job, dict), job
        status, _ = await call(s, module_daemon, "POST", f"/v1/jobs/{job['id']}/cancel", oncall)
        assert status == 200
        status, _ = await call(s, module_daemon, "POST", f"/v1/jobs/{job['id']}/cancel", oncall)
        assert status == 409
        status, _ = await call(s, module_daemon, "POST", f"/v1/jobs/{job['id']}/retry", reader)
        assert status == 403
        status, _ = await call(s, module_daemon, "GET", f"/v1/jobs/{job['id']}", reader)
        assert status == 200

    # the refusal is the last of the four lines: logged once it is, the others are too
    await module_daemon.log.wait_for(f"/v1/jobs/{job['id']}/retry", token="dashboards")
    lines = module_daemon.log.events()
    jid = job["id"]
    cancels = [
        (entry["token"], entry["message"])
        for entry in lines
        if entry.get("token")
        and (f"/v1/jobs/{jid}/" in entry["message"] or f"job {jid}" in entry["message"])
    ]
    assert cancels == [
        ("oncall", f"operator action cancel job {jid} by 'oncall' (api): done"),
        (
            "oncall",
            f"operator action cancel job {jid} by 'oncall' (api): refused: "
            f"job {jid} is already cancelled; nothing to cancel",
        ),
        (
            "dashboards",
            f"token 'dashboards' refused POST /v1/jobs/{jid}/retry: it lacks scope operate",
        ),
    ]
    assert {
        (e.get("actor"), e.get("door"))
        for e in lines
        if e["message"].startswith(f"operator action cancel job {jid} ")
    } == {("oncall", "api")}
    text = module_daemon.log_text()
    for token, _ in TOKENS.values():
        assert token not in text


# the command line -------------------------------------------------------------------------------
async def test_check_config_shows_names_and_scopes_and_masks_the_tokens(tmp_path: Path) -> None:
    (tmp_path / "api-tokens").write_text(TOKENS_FILE)
    env = {
        "DISPATCHER_API_TOKENS_FILE": str(tmp_path / "api-tokens"),
        "DISPATCHER_API_TOKENS": ENV_TOKENS,
    }
    result = await cli("check-config", cwd=tmp_path, env=env)
    assert result.code == 0, result.stderr
    view = json.loads(result.stdout)
    assert {(t["name"], tuple(t["scopes"])) for t in view["api_token_scopes"]} == {
        (name, tuple(sorted(scopes))) for name, (_, scopes) in TOKENS.items()
    }
    assert view["api_tokens"] == ["**********"]
    for token, _ in TOKENS.values():
        assert token not in result.stdout + result.stderr


@pytest.mark.parametrize("command", ["check-config", "run"])
async def test_a_bad_tokens_file_names_the_line_and_never_the_token(
    tmp_path: Path, command: str
) -> None:
    (tmp_path / "api-tokens").write_text(TOKENS_FILE + "tok-typo-6f4a5b read,opreate # typo\n")
    env = {"DISPATCHER_API_TOKENS_FILE": str(tmp_path / "api-tokens")}
    result = await cli(command, cwd=tmp_path, env=env)
    assert result.code == 2
    assert result.stderr.splitlines() == [
        "dispatcher: configuration error: api_tokens_file line 7: scope 2 of 2 is not one of "
        "read, enqueue, operate (commas between scopes, no spaces)"
    ]
    assert "tok-typo" not in result.stdout + result.stderr
