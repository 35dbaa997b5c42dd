"""The console over real HTTP on a real daemon (a child process; in process where a test builds
its settings; real PostgreSQL): sign-in and its cookie, CSRF, scopes, security headers, escaping,
page weight, the open console without tokens and the console's own listener."""

from __future__ import annotations

from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from tests.console.common import (
    HOSTILE_ERROR,
    HOSTILE_KEY,
    HOSTILE_PAYLOAD,
    HOSTILE_TENANT,
    OPERATOR_TOKEN,
    TOKENS,
    TOKENS_ENV,
    VIEWER_TOKEN,
    form_token,
    page,
    session,
    sign_in,
)
from tests.harness import (
    DaemonHandle,
    Target,
    free_port,
    make_settings,
    running_daemon,
    serve_target,
    wait_until,
)

PAGES = (
    "/console/",
    "/console/?range=24h",  # the history charts' heaviest range (96 steps)
    "/console/queues/default?range=7d",
    "/console/jobs",
    "/console/dead",
    "/console/schedules",
)
WEIGHT_LIMIT = 150 * 1024


@pytest.fixture
def daemon_env() -> dict[str, str]:
    return {"DISPATCHER_API_TOKENS": TOKENS_ENV}


async def queue_paused(db_url: str, name: str = "default") -> bool:
    conn = await asyncpg.connect(db_url)
    try:
        return bool(
            await conn.fetchval("SELECT paused FROM dispatcher.queues WHERE name = $1", name)
        )
    finally:
        await conn.close()


async def test_pages_need_a_session(daemon: DaemonHandle, db_url: str) -> None:
    async with session() as client:
        for path in PAGES:
            status, _, headers = await page(client, daemon.base_url + path)
            assert (status, headers["Location"]) == (303, f"/console/login?next={path}")
        status, _, _ = await page(client, daemon.base_url + "/console/live.json")
        assert status == 401
        async with client.post(daemon.base_url + "/console/queues/default/pause", data={}) as r:
            assert r.status == 401
    assert not await queue_paused(db_url)


async def test_sign_in_sets_a_strict_http_only_cookie(daemon: DaemonHandle) -> None:
    async with session() as client:
        wrong = await sign_in(client, daemon.base_url, "not-a-token")
        assert wrong.status == 401 and "dispatcher_console=" not in str(
            wrong.headers.getall("Set-Cookie", [])
        )
        signed = await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        assert (signed.status, signed.headers["Location"]) == (303, "/console/")
        (cookie,) = [
            c for c in signed.headers.getall("Set-Cookie") if c.startswith("dispatcher_console=")
        ]
        flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite", "path", "max-age"} <= flags, cookie
        assert "SameSite=Strict" in cookie and "Path=/console/" in cookie
        assert "secure" not in flags  # plain HTTP: a Secure cookie would never come back
        assert OPERATOR_TOKEN not in cookie
        for path in PAGES:
            status, html, _ = await page(client, daemon.base_url + path)
            assert status == 200, html[:500]
            assert "signed in as <strong>ops</strong>" in html


async def test_the_login_form_has_its_own_csrf_token(daemon: DaemonHandle) -> None:
    async with (
        session() as client,
        client.post(
            daemon.base_url + "/console/login",
            data={"csrf": "0" * 64, "token": OPERATOR_TOKEN},
            allow_redirects=False,
        ) as r,
    ):
        assert r.status == 403
        assert "dispatcher_console=" not in str(r.headers.getall("Set-Cookie", []))


async def test_every_answer_carries_the_security_headers(daemon: DaemonHandle) -> None:
    async with session() as client:
        await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        for path in (
            *PAGES,
            "/console/login",
            "/console/jobs/999999",
            "/console/static/console.css",
        ):
            _, _, headers = await page(client, daemon.base_url + path)
            csp = headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp, csp
            assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
            assert headers["X-Frame-Options"] == "DENY"
            assert headers["X-Content-Type-Options"] == "nosniff"


async def test_a_post_without_the_sessions_csrf_token_changes_nothing(
    daemon: DaemonHandle, db_url: str
) -> None:
    url = daemon.base_url + "/console/queues/default/pause"
    async with session() as client, session() as other:
        await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        await sign_in(other, daemon.base_url, OPERATOR_TOKEN)
        _, html, _ = await page(other, url)
        foreign = form_token(html)  # a valid token, of another session
        for data in ({}, {"csrf": ""}, {"csrf": "f" * 64}, {"csrf": foreign}):
            async with client.post(url, data=data) as r:
                assert r.status == 403, data
                assert "CSRF" in await r.text()
        _, html, _ = await page(client, url)
        mine = form_token(html)
        async with client.post(
            url, data={"csrf": mine}, headers={"Origin": "https://evil.example"}
        ) as r:
            assert r.status == 403
        assert not await queue_paused(db_url)
        async with client.post(url, data={"csrf": mine}) as r:
            assert r.status == 200 and "Queue default is paused." in await r.text()
        assert await queue_paused(db_url)


async def test_a_read_only_token_sees_no_action_and_is_refused_if_it_acts(
    daemon: DaemonHandle, db_url: str
) -> None:
    async with session() as client:
        await sign_in(client, daemon.base_url, VIEWER_TOKEN)
        status, html, _ = await page(client, daemon.base_url + "/console/")
        assert status == 200 and "read-only" in html
        for path in PAGES:
            _, html, _ = await page(client, daemon.base_url + path)
            assert "/pause" not in html and "/redrive" not in html and "Catch up" not in html
        status, html, _ = await page(client, daemon.base_url + "/console/queues/default/pause")
        assert status == 403 and "read-only" in html
        csrf = form_token((await page(client, daemon.base_url + "/console/"))[1])  # sign-out form
        for path in (
            "/console/queues/default/pause",
            "/console/dead/redrive",
            "/console/jobs/1/retry",
        ):
            async with client.post(
                daemon.base_url + path, data={"csrf": csrf, "queue": "default"}
            ) as r:
                assert r.status == 403, path
    assert not await queue_paused(db_url)


async def hostile_job(daemon: DaemonHandle, target: Target) -> int:
    async def refuse(request: web.Request, count: int) -> web.StreamResponse:
        return web.Response(status=400, text=HOSTILE_ERROR)

    target.respond = refuse
    job = await daemon.post_job(
        HOSTILE_KEY,
        {
            "handler": "http",
            "target": {
                "url": target.url + "?token=s3cret",
                "headers": {"Authorization": "Bearer hunter2"},
            },
            "payload": HOSTILE_PAYLOAD,
            "tenant": HOSTILE_TENANT,
        },
    )
    await wait_until(lambda: daemon.get_job(job["id"]), what="job exists")

    async def dead() -> bool:
        return (await daemon.get_job(job["id"]))["state"] == "dead"

    await wait_until(dead, what="hostile job dead")
    return int(job["id"])


async def test_hostile_text_is_shown_as_text(db_url: str) -> None:
    settings = make_settings(db_url, api_tokens=TOKENS)
    async with serve_target(Target()) as target, running_daemon(settings) as daemon:
        daemon.session.headers["Authorization"] = f"Bearer {OPERATOR_TOKEN}"
        jid = await hostile_job(daemon, target)
        async with session() as client:
            await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
            for path in (
                f"/console/jobs/{jid}",
                "/console/jobs",
                "/console/dead",
                "/console/jobs?state=dead",
            ):
                status, html, _ = await page(client, daemon.base_url + path)
                assert status == 200, html[:300]
                assert "<script>window" not in html and "<img src=x" not in html, path
                assert "&lt;script&gt;window.__pwned=" in html, path
                assert "\x1b" not in html and "\u202e" not in html and "\x07" not in html
            _, html, _ = await page(client, daemon.base_url + f"/console/jobs/{jid}")
            assert (
                "\\u001b[31m\\u202eevil" in html
            )  # the tenant's invisible characters, written out
            assert "hunter2" not in html and "s3cret" not in html  # the target's secrets
            assert "Authorization: •••" in html and "token=•••" in html


async def test_the_pages_weigh_less_than_150_kb(daemon: DaemonHandle) -> None:
    async with session() as client:
        await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        static = 0
        for asset in (
            "/console/static/console.css",
            "/console/static/console.js",
            "/console/static/bulk.js",
        ):
            async with client.get(daemon.base_url + asset) as r:
                assert r.status == 200
                static += len(await r.read())
        for path in PAGES:
            _, html, _ = await page(client, daemon.base_url + path)
            assert "http://" not in html.replace(daemon.base_url, "") and "https://" not in html
            total = len(html.encode()) + static
            print(f"{path}: {total} bytes with its stylesheet and script")
            assert total < WEIGHT_LIMIT


async def test_without_tokens_the_console_is_open_and_still_needs_csrf(db_url: str) -> None:
    async with running_daemon(make_settings(db_url)) as daemon, session() as client:
        status, html, headers = await page(client, daemon.base_url + "/console/")
        assert status == 200 and "open console" in html
        assert "SameSite=Strict" in headers["Set-Cookie"]
        url = daemon.base_url + "/console/queues/default/pause"
        csrf = form_token((await page(client, url))[1])
        async with (
            aiohttp.ClientSession() as cookieless,
            cookieless.post(url, data={"csrf": csrf}) as r,
        ):
            assert r.status == 403  # a token without its session (e.g. from another site)
        assert not await queue_paused(db_url)
        async with client.post(url, data={"csrf": csrf}) as r:
            assert r.status == 200
        assert await queue_paused(db_url)


async def test_the_console_on_its_own_listener(db_url: str) -> None:
    port = free_port()
    settings = make_settings(db_url, api_tokens=TOKENS, console_listen=f"127.0.0.1:{port}")
    async with running_daemon(settings) as daemon, session() as client:
        base = f"http://127.0.0.1:{port}"
        signed = await sign_in(client, base, OPERATOR_TOKEN)
        assert signed.status == 303
        status, _, _ = await page(client, base + "/console/")
        assert status == 200
        async with client.get(base + "/", allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (302, "/console/")
        async with client.get(daemon.base_url + "/console/", allow_redirects=False) as r:
            assert r.status in (401, 404)  # not on the API listener
        async with client.get(base + "/v1/jobs") as r:
            assert r.status == 404  # and no API on the console's


def test_a_console_listener_off_loopback_needs_tokens_and_tls() -> None:
    with pytest.raises(ValueError, match=r"console_listen .* API tokens are required"):
        make_settings("postgresql://x/y", console_listen="0.0.0.0:9000")
    with pytest.raises(ValueError, match=r"console_listen .* no TLS"):
        make_settings("postgresql://x/y", console_listen="0.0.0.0:9000", api_tokens=TOKENS)
    assert make_settings(
        "postgresql://x/y",
        console_listen="0.0.0.0:9000",
        api_tokens=TOKENS,
        allow_plain_http_tokens=True,
    )


async def test_the_live_numbers_follow_a_pause(daemon: DaemonHandle, db_url: str) -> None:
    async with session() as client:
        await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        async with client.get(daemon.base_url + "/console/live.json") as r:
            live: dict[str, Any] = await r.json()
        assert live["queues"]["default"]["paused"] == "active"
        url = daemon.base_url + "/console/queues/default/pause"
        csrf = form_token((await page(client, url))[1])
        async with client.post(url, data={"csrf": csrf}) as r:
            assert r.status == 200
        async with client.get(daemon.base_url + "/console/live.json") as r:
            assert (await r.json())["queues"]["default"]["paused"] == "paused"


async def runs_of(db_url: str, schedule: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        n = await conn.fetchval(
            "SELECT count(*) FROM dispatcher.runs WHERE schedule = $1", schedule
        )
        return int(n)
    finally:
        await conn.close()


async def test_a_trigger_with_a_bad_period_is_refused_and_creates_nothing(db_url: str) -> None:
    schedule = {
        "name": "weekdays",
        "cron": "30 6 * * mon-fri",
        "timezone": "Europe/Berlin",
        "handler": "http",
        "misfire_grace_s": 0,
        "target": {"url": "http://127.0.0.1:9/"},
    }
    settings = make_settings(db_url, api_tokens=TOKENS, schedules=[schedule])
    async with running_daemon(settings) as d, session() as client:
        await sign_in(client, d.base_url, OPERATOR_TOKEN)
        base = f"{d.base_url}/console/schedules/weekdays/trigger"
        _, html, _ = await page(client, d.base_url + "/console/schedules")
        csrf = form_token(html)
        # not a time; not a period start of the schedule (07:30 Berlin); empty
        for period in ("yesterday", "2026-06-01T05:30:00Z", ""):
            status, html, _ = await page(client, f"{base}?period_start={period}")
            assert status == 422 and "period_start" in html, (period, status, html[:500])
            async with client.post(base, data={"csrf": csrf, "period_start": period}) as r:
                assert r.status == 422, (period, r.status)
        status, _, _ = await page(client, d.base_url + "/console/schedules/nope/trigger")
        assert status == 404
        assert await runs_of(db_url, "weekdays") == 0
        # the API's status of the same schedule: in words, next fires in Berlin and UTC
        async with d.session.get(
            f"{d.base_url}/v1/schedules", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        ) as r:
            (view,) = (await r.json())["schedules"]
        assert view["description"] == "at 06:30, Monday to Friday"
        first = view["next_fires"][0]
        assert first["at"] == view["next_fire_at"] and first["local"][11:16] == "06:30"
        # a good period is created once: 2026-06-01 is a Monday, 06:30 Berlin is 04:30Z
        period = "2026-06-01T04:30:00Z"
        async with client.post(base, data={"csrf": csrf, "period_start": period}) as r:
            assert r.status == 200 and "created" in await r.text()
        async with client.post(base, data={"csrf": csrf, "period_start": period}) as r:
            assert r.status == 200 and "existing" in await r.text()
        assert await runs_of(db_url, "weekdays") == 1
