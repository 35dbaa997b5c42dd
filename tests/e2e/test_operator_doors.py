"""The three doors of the operator service (dispatcher.operator.service) on a real daemon: the
HTTP API, the console and the CLI give the same refusal for the same bad action (a retry of a
running job, a pause of a queue that does not exist), each in its own form (a problem document,
an error page, an exit status), and every action is audited with who asked, the CLI's with the
OS user."""

from __future__ import annotations

import getpass
import html
import json
import logging
import re
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.console.common import form_token, session
from tests.harness import InProcessDaemon, cli, make_settings, running_daemon

FAR = "2031-05-31T00:00:00Z"


async def api_refusal(d: InProcessDaemon, path: str) -> tuple[int, str]:
    async with d.session.post(f"{d.base_url}{path}") as r:
        return r.status, (await r.json(content_type=None))["detail"]


async def console_refusal(client: aiohttp.ClientSession, base: str, path: str) -> tuple[int, str]:
    """Confirm, then post the console's form; the error page's status and detail."""
    async with client.get(f"{base}/console{path}") as r:
        page = await r.text()
        if r.status != 200:  # refused before the form (a queue not in the registry)
            return r.status, detail_of(page)
    async with client.post(f"{base}/console{path}", data={"csrf": form_token(page)}) as r:
        return r.status, detail_of(await r.text())


def detail_of(page: str) -> str:
    match = re.search(r'<p role="alert" class="alert">(.*?)</p>', page, re.S)
    assert match is not None, page[:2000]
    return html.unescape(match.group(1)).strip()


async def test_the_three_doors_refuse_the_same_action_alike(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dispatcher.operator")
    settings = make_settings(db_url, queues={"default": {}})
    env = {"DISPATCHER_DATABASE_URL": db_url}
    conn = await asyncpg.connect(db_url)
    try:
        async with running_daemon(settings) as d, session() as browser:
            body = {"handler": "http", "target": {"url": "https://x.example/"}, "due_at": FAR}
            job = (await d.post_job("running-one", body))["id"]
            await conn.execute(
                "UPDATE dispatcher.jobs SET state = 'running', lease_owner = 'w:1', attempt = 1,"
                " lease_expires_at = now() + interval '1 hour' WHERE id = $1",
                job,
            )
            refusal = f"job {job} is running; only dead, cancelled or discarded jobs can be retried"
            assert await api_refusal(d, f"/v1/jobs/{job}/retry") == (409, refusal)
            assert await console_refusal(browser, d.base_url, f"/jobs/{job}/retry") == (
                409,
                refusal,
            )
            by_cli = await cli("jobs", "retry", str(job), cwd=tmp_path, env=env)
            assert (by_cli.code, by_cli.stderr.splitlines()[-1]) == (1, f"dispatcher: {refusal}")

            missing = "no queue 'nope'; queues: default"
            assert await api_refusal(d, "/v1/queues/nope/pause") == (404, missing)
            assert await console_refusal(browser, d.base_url, "/queues/nope/pause") == (
                404,
                missing,
            )
            by_cli = await cli("queues", "pause", "nope", cwd=tmp_path, env=env)
            assert (by_cli.code, by_cli.stderr.splitlines()[-1]) == (1, f"dispatcher: {missing}")
            assert await conn.fetchval("SELECT state FROM dispatcher.jobs WHERE id = $1", job) == (
                "running"
            )
        # the daemon's two doors audited the refused retry once each (the CLI: its own stderr)
        retries = [
            (r.door, r.getMessage().endswith(f"(api): refused: {refusal}")
             or r.getMessage().endswith(f"(console): refused: {refusal}"))
            for r in caplog.records
            if r.getMessage().startswith(f"operator action retry job {job} ")
        ]  # fmt: skip
        assert sorted(retries) == [("api", True), ("console", True)]
    finally:
        await conn.close()


def audit_lines(stderr: str) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [e for e in entries if e["message"].startswith("operator action ")]


async def test_a_cli_action_is_audited_with_the_os_user(db_url: str, tmp_path: Path) -> None:
    settings = make_settings(db_url, queues={"default": {}})
    env = {"DISPATCHER_DATABASE_URL": db_url, "DISPATCHER_LOG_FORMAT": "json"}
    user = getpass.getuser()
    async with running_daemon(settings):
        paused = await cli("queues", "pause", "default", cwd=tmp_path, env=env)
        assert paused.code == 0, paused.stderr
        refused = await cli("queues", "resume", "nope", cwd=tmp_path, env=env)
        assert refused.code == 1
    assert [(e["message"], e["actor"], e["door"]) for e in audit_lines(paused.stderr)] == [
        (f"operator action pause queue 'default' by {user!r} (cli): done", user, "cli")
    ]
    assert [e["message"] for e in audit_lines(refused.stderr)] == [
        f"operator action resume queue 'nope' by {user!r} (cli): refused: "
        "no queue 'nope'; queues: default"
    ]
    assert "token" not in audit_lines(paused.stderr)[0]  # an OS user is not a token


async def test_run_now_at_each_door_makes_a_scheduled_job_ready_and_refuses_a_ready_one(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The one-job action added last (issue 21's "one service method, one table row, one console
    entry, one CLI line"): the same move and the same refusal at the API, the console and the
    CLI, each audited."""
    caplog.set_level(logging.INFO, logger="dispatcher.operator")
    settings = make_settings(db_url, queues={"default": {}})
    env = {"DISPATCHER_DATABASE_URL": db_url}
    conn = await asyncpg.connect(db_url)
    try:
        async with running_daemon(settings) as d, session() as browser:
            async with d.session.post(f"{d.base_url}/v1/queues/default/pause") as r:
                assert r.status == 200  # ready jobs stay ready: nothing claims them
            body = {"handler": "http", "target": {"url": "https://x.example/"}, "due_at": FAR}
            by_api, by_console, by_cli = [
                (await d.post_job(f"later-{door}", body))["id"] for door in ("api", "ui", "cli")
            ]
            async with d.session.post(f"{d.base_url}/v1/jobs/{by_api}/run-now") as r:
                assert r.status == 200
                assert (await r.json())["state"] == "ready"
            async with browser.get(f"{d.base_url}/console/jobs/{by_console}/run_now") as r:
                page = await r.text()
                assert r.status == 200 and "Run now" in page
            async with browser.post(
                f"{d.base_url}/console/jobs/{by_console}/run_now", data={"csrf": form_token(page)}
            ) as r:
                assert r.status == 200, await r.text()
            ran = await cli("jobs", "run-now", str(by_cli), "--json", cwd=tmp_path, env=env)
            assert ran.code == 0, ran.stderr
            assert json.loads(ran.stdout)["state"] == "ready"
            rows = await conn.fetch(
                "SELECT id, state, due_at <= now() AS due FROM dispatcher.jobs WHERE id = ANY($1)",
                [by_api, by_console, by_cli],
            )
            assert {(r["state"], r["due"]) for r in rows} == {("ready", True)}

            refusal = (
                f"job {by_api} is ready; only scheduled jobs can be run now (it is ready already)"
            )
            assert await api_refusal(d, f"/v1/jobs/{by_api}/run-now") == (409, refusal)
            assert await console_refusal(browser, d.base_url, f"/jobs/{by_api}/run_now") == (
                409,
                refusal,
            )
            again = await cli("jobs", "run-now", str(by_api), cwd=tmp_path, env=env)
            assert (again.code, again.stderr.splitlines()[-1]) == (1, f"dispatcher: {refusal}")
        audited = sorted(
            (
                r.door,
                r.getMessage().rsplit(": ", 1)[-1]
                if "refused" not in r.getMessage()
                else "refused",
            )
            for r in caplog.records
            if r.getMessage().startswith("operator action run_now job ")
        )
        assert audited == [
            ("api", "done"),
            ("api", "refused"),
            ("console", "done"),
            ("console", "refused"),
        ]
    finally:
        await conn.close()
