"""Console sessions live on the server (issue 20, defect 5): signing out ends every copy of the
cookie, `dispatcher console sessions` lists and revokes them, a removed token's sessions end, and
daemons sharing a database share the sessions. Real daemons, real PostgreSQL, real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from yarl import URL

from tests.console.common import (
    OPERATOR_TOKEN,
    TOKENS,
    VIEWER_TOKEN,
    form_token,
    page,
    session,
    sign_in,
)
from tests.harness import InProcessDaemon, Result, cli, make_settings, running_daemon

FAR_FUTURE = "2099-01-01T00:00:00Z"


def cookie_of(client: aiohttp.ClientSession) -> str:
    (value,) = [m.value for m in client.cookie_jar if m.key == "dispatcher_console"]
    return value


def copy_of(cookie: str) -> aiohttp.ClientSession:
    """Another client holding a copy of `cookie` (taken from the browser before sign-out)."""
    thief = session()
    thief.cookie_jar.update_cookies(
        {"dispatcher_console": cookie}, URL("http://127.0.0.1/console/")
    )
    return thief


async def signed_in(client: aiohttp.ClientSession, base: str) -> bool:
    status, _, _ = await page(client, base + "/console/")
    return status == 200


async def sign_out(client: aiohttp.ClientSession, base: str) -> None:
    csrf = form_token((await page(client, base + "/console/"))[1])  # the sign-out form's
    async with client.post(
        base + "/console/logout", data={"csrf": csrf}, allow_redirects=False
    ) as r:
        assert r.status == 303


async def future_job(daemon: InProcessDaemon) -> int:
    body = {"handler": "http", "target": {"url": "http://127.0.0.1:9/"}, "due_at": FAR_FUTURE}
    async with daemon.session.post(
        daemon.base_url + "/v1/jobs",
        json=body,
        headers={"Idempotency-Key": "sign-out-1", "Authorization": f"Bearer {OPERATOR_TOKEN}"},
    ) as r:
        assert r.status == 202, await r.text()
        job_id: int = (await r.json())["id"]
        return job_id


async def job_state(db_url: str, job_id: int) -> str:
    conn = await asyncpg.connect(db_url)
    try:
        return str(await conn.fetchval("SELECT state FROM dispatcher.jobs WHERE id = $1", job_id))
    finally:
        await conn.close()


async def test_a_copied_cookie_is_refused_after_sign_out(db_url: str) -> None:
    """Before: the copy still read pages and cancelled jobs, with its CSRF token, for 8 h."""
    settings = make_settings(db_url, api_tokens=TOKENS)
    async with running_daemon(settings) as daemon, session() as browser:
        job_id = await future_job(daemon)
        base = daemon.base_url
        await sign_in(browser, base, OPERATOR_TOKEN)
        cancel = f"{base}/console/jobs/{job_id}/cancel"
        csrf = form_token((await page(browser, cancel))[1])
        async with copy_of(cookie_of(browser)) as thief:
            assert await signed_in(thief, base)  # the copy works while the session lives
            await sign_out(browser, base)
            status, _, headers = await page(thief, base + "/console/jobs")
            assert (status, headers["Location"]) == (303, "/console/login?next=/console/jobs")
            async with thief.get(base + "/console/live.json") as r:
                assert r.status == 401
            async with thief.post(cancel, data={"csrf": csrf}, allow_redirects=False) as r:
                assert r.status == 401
        assert await job_state(db_url, job_id) == "scheduled"
        assert not await signed_in(browser, base)


async def test_daemons_sharing_a_database_share_sessions(db_url: str) -> None:
    """A session made on one daemon works on another; signing out on one ends it on both."""
    async with (
        running_daemon(make_settings(db_url, api_tokens=TOKENS)) as first,
        running_daemon(make_settings(db_url, api_tokens=TOKENS)) as second,
        session() as browser,
    ):
        await sign_in(browser, first.base_url, VIEWER_TOKEN)
        async with copy_of(cookie_of(browser)) as elsewhere:
            assert await signed_in(elsewhere, second.base_url)
            await sign_out(browser, first.base_url)
            assert not await signed_in(elsewhere, second.base_url)


async def sessions_cli(db_url: str, tmp_path: Path, *args: str) -> Result:
    return await cli(
        "console", "sessions", *args, cwd=tmp_path, env={"DISPATCHER_DATABASE_URL": db_url}
    )


async def listed(db_url: str, tmp_path: Path) -> list[dict[str, Any]]:
    result = await sessions_cli(db_url, tmp_path, "--json")
    assert result.code == 0, result.stderr
    sessions: list[dict[str, Any]] = json.loads(result.stdout)["sessions"]
    return sessions


async def test_sessions_are_listed_and_revoked_with_the_cli(db_url: str, tmp_path: Path) -> None:
    settings = make_settings(db_url, api_tokens=TOKENS)
    async with running_daemon(settings) as daemon, session() as ops, session() as viewer:
        base = daemon.base_url
        await sign_in(ops, base, OPERATOR_TOKEN)
        await sign_in(viewer, base, VIEWER_TOKEN)
        rows = await listed(db_url, tmp_path)
        assert [(r["token"], r["client"]) for r in rows] == [
            ("ops", "127.0.0.1"),
            ("viewer", "127.0.0.1"),
        ]
        table = (await sessions_cli(db_url, tmp_path)).stdout
        assert "ops" in table and "viewer" in table and cookie_of(ops) not in table
        by_token = {r["token"]: r["id"] for r in rows}

        revoked = await sessions_cli(db_url, tmp_path, "revoke", str(by_token["viewer"]))
        assert (revoked.code, revoked.stdout.strip()) == (
            0,
            f"revoked session {by_token['viewer']}",
        )
        assert not await signed_in(viewer, base)
        assert await signed_in(ops, base)
        assert [r["token"] for r in await listed(db_url, tmp_path)] == ["ops"]

        again = await sessions_cli(db_url, tmp_path, "revoke", str(by_token["viewer"]))
        assert again.code == 1 and f"no console session {by_token['viewer']}" in again.stderr

        everything = await sessions_cli(db_url, tmp_path, "revoke", "--all")
        assert (everything.code, everything.stdout.strip()) == (0, "revoked 1 session(s)")
        assert not await signed_in(ops, base)
        assert await listed(db_url, tmp_path) == []
        assert (await sessions_cli(db_url, tmp_path)).stdout.strip() == "no console sessions"


async def test_removing_a_token_ends_its_sessions(db_url: str, tmp_path: Path) -> None:
    async with session() as ops, session() as viewer:
        async with running_daemon(make_settings(db_url, api_tokens=TOKENS)) as daemon:
            await sign_in(ops, daemon.base_url, OPERATOR_TOKEN)
            await sign_in(viewer, daemon.base_url, VIEWER_TOKEN)
            assert len(await listed(db_url, tmp_path)) == 2
        cookie = cookie_of(viewer)
        # the viewer's token is removed; the daemon starts again with the operator's alone
        async with running_daemon(make_settings(db_url, api_tokens=TOKENS[:1])) as daemon:
            assert await listed(db_url, tmp_path) == []  # ended at start, not only refused
            async with copy_of(cookie) as holder:
                assert not await signed_in(holder, daemon.base_url)
            # (changing the token set changes the signing key: every session signs in again)
            assert not await signed_in(ops, daemon.base_url)
            assert (await sign_in(ops, daemon.base_url, OPERATOR_TOKEN)).status == 303
            assert (await sign_in(viewer, daemon.base_url, VIEWER_TOKEN)).status == 401
            assert [r["token"] for r in await listed(db_url, tmp_path)] == ["ops"]
