"""The console in a real headless Chromium against a real daemon process: sign in, see a dead
job, retry it and redrive another (the dry-run count shown first) and watch them succeed; pause
and resume a queue and watch the live counters change; a catch-up's dry run, then the catch-up;
a read-only token; a hostile payload stays inert; 320 px wide; the keyboard. A screenshot of
each page goes to the test's temporary directory (CONSOLE_SCREENSHOT=path also writes the
overview there; the documentation's pictures come from tools/screenshots.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.console.browser import Browser, needs_chromium
from tests.console.common import (
    HOSTILE_ERROR,
    HOSTILE_KEY,
    HOSTILE_PAYLOAD,
    HOSTILE_TENANT,
    OPERATOR_TOKEN,
    TOKENS_ENV,
    VIEWER_TOKEN,
)
from tests.harness import DaemonProcess, Target, serve_target, wait_until

pytestmark = needs_chromium
AUTH = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    """Refuses (400, permanent: the job dies at once) until `target.fixed` is set."""
    state: dict[str, bool] = {"fixed": False}

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        if state["fixed"]:
            return web.json_response({"ok": True})
        return web.Response(status=400, text=HOSTILE_ERROR)

    async with serve_target(Target(respond=respond)) as t:
        t.fixed = state  # type: ignore[attr-defined]
        yield t


@pytest.fixture
def daemon_env(tmp_path: Path, target: Target) -> dict[str, str]:
    config = tmp_path / "dispatcher.toml"
    # an hourly schedule to catch up and trigger, and a weekday one in Berlin to read; the
    # http handler pushes to the test's target
    config.write_text(
        '[[schedules]]\nname = "hourly"\ncron = "0 * * * *"\nhandler = "http"\n'
        f'overlap = "allow"\ntarget = {{ url = "{target.url}" }}\n'
        '[[schedules]]\nname = "berlin"\ncron = "30 6 * * mon-fri"\nhandler = "http"\n'
        f'timezone = "Europe/Berlin"\nmisfire_grace_s = 0\ntarget = {{ url = "{target.url}" }}\n'
    )
    return {
        "DISPATCHER_API_TOKENS": TOKENS_ENV,
        "DISPATCHER_DRAIN_TIMEOUT_S": "5",
        "DISPATCHER_CONFIG": str(config),
    }


async def enqueue(daemon: DaemonProcess, key: str, target: Target, **fields: Any) -> int:
    body = {"handler": "http", "target": {"url": target.url}, **fields}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{daemon.base_url}/v1/jobs", json=body, headers={**AUTH, "Idempotency-Key": key}
        ) as r,
    ):
        assert r.status == 202, await r.text()
        return int((await r.json())["id"])


async def job_state(daemon: DaemonProcess, jid: int) -> str:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{daemon.base_url}/v1/jobs/{jid}", headers=AUTH) as r,
    ):
        return str((await r.json())["state"])


async def until_state(daemon: DaemonProcess, jid: int, state: str) -> None:
    async def reached() -> bool:
        return await job_state(daemon, jid) == state

    await wait_until(reached, what=f"job {jid} {state}")


async def until_text(browser: Browser, css: str, text: str, reload: bool = False) -> None:
    async def shown() -> bool:
        if reload:
            await browser.call(browser.driver.refresh)
        return text in await browser.text(css)

    await wait_until(shown, timeout_s=30, interval_s=0.25, what=f"{text!r} in {css}")


async def test_sign_in_retry_and_redrive_dead_jobs(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    first = await enqueue(daemon, "grant-1", target)
    second = await enqueue(daemon, "grant-2", target)
    await until_state(daemon, first, "dead")
    await until_state(daemon, second, "dead")

    await browser.sign_in(OPERATOR_TOKEN)
    assert await browser.path() == "/console/"
    assert "signed in as ops" in await browser.page_text()
    await until_text(browser, "#queues td[data-f=dead]", "2")
    await browser.screenshot("overview", also=screenshot_target())
    # the count is a link to the jobs it counts
    await browser.click(await browser.find("#queues td[data-f=dead] a"))
    await browser.wait_for_path("/console/jobs")
    listed = await browser.page_text()
    assert "grant-1" in listed and "grant-2" in listed, listed

    await browser.click(await browser.link("Dead letters"))
    groups = await browser.text("#dead-groups tbody")
    assert "default" in groups and "http_4xx" in groups and "2" in groups
    await browser.screenshot("dead-letters")
    # the group's List link keeps the reason, and lists the group
    listing = await browser.link("List")
    assert "reason=http_4xx" in await browser.call(listing.get_attribute, "href")
    await browser.click(listing)
    await browser.wait_for_path("/console/jobs")
    listed = await browser.page_text()
    assert "grant-1" in listed and "grant-2" in listed, listed
    await browser.click(await browser.link("Dead letters"))

    target.fixed["fixed"] = True  # type: ignore[attr-defined]
    # one job retried from its row...
    await browser.get(f"/console/jobs/{first}/retry")
    assert f"Retry job {first}?" in await browser.page_text()
    await browser.click(await browser.find("#confirm"))
    assert f"Job {first} is now ready." in await browser.text("#outcome")
    await until_state(daemon, first, "succeeded")
    # ...the rest redriven in bulk, after the dry run's count
    await browser.get("/console/dead")
    await browser.click(await browser.link("Redrive"))
    assert await browser.text("#dry-run-count") == "1"
    await browser.screenshot("redrive-dry-run")
    await browser.click(await browser.find("#confirm"))
    assert "Redriven: 1 dead jobs." in await browser.text("#outcome")
    await until_state(daemon, second, "succeeded")

    await browser.get(f"/console/jobs/{second}")
    await until_text(browser, "h1", "succeeded", reload=True)
    history = await browser.text("#attempts")
    assert "dead" in history and "succeeded" in history
    await browser.screenshot("job")


async def test_pause_and_resume_a_queue_watching_the_counters(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    target.fixed["fixed"] = True  # type: ignore[attr-defined]
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.click(await browser.link("Pause"))
    await browser.wait_for_text("Pause queue default?")
    await browser.click(await browser.find("#confirm"))
    assert "Queue default is paused." in await browser.text("#outcome")
    await browser.get("/console/")
    assert await browser.text("#queues td[data-f=paused]") == "paused"

    jid = await enqueue(daemon, "while-paused", target)
    # the page is not reloaded: its script polls and the counter moves
    await until_text(browser, "#queues td[data-f=ready]", "1")
    assert await job_state(daemon, jid) == "ready"
    await browser.screenshot("overview-paused")

    await browser.click(await browser.link("Resume"))
    await browser.click(await browser.find("#confirm"))
    # the answer first: navigating away while the form's POST is in flight can cancel it, or
    # leave its answer page in place of the overview
    assert "Queue default is active." in await browser.text("#outcome")
    await browser.get("/console/")
    await until_text(browser, "#queues td[data-f=succeeded]", "1")
    assert await browser.text("#queues td[data-f=ready]") == "0"
    assert await browser.text("#queues td[data-f=paused]") == "active"


async def test_catch_up_dry_run_then_catch_up(daemon: DaemonProcess, browser: Browser) -> None:
    day = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.click(await browser.link("Schedules"))
    await browser.type_into("#from-hourly", f"{day}T00:00:00Z")
    await browser.type_into("#to-hourly", f"{day}T03:00:00Z")
    await browser.screenshot("schedules")
    await browser.click(await browser.find("#schedule-hourly form button"))
    assert await browser.text("#would-create") == "4"
    await browser.screenshot("catch-up-dry-run")
    await browser.click(await browser.find("#confirm"))
    assert "4 runs created, 0 existed" in await browser.text("#outcome")
    await browser.get("/console/schedules")
    receipts = await browser.text("#schedule-hourly .receipts")
    assert receipts.count("catch_up") == 4, receipts
    # the same range again: nothing left to create
    await browser.get(f"/console/schedules/hourly/catch-up?from={day}T00:00:00Z&to={day}T03:00:00Z")
    assert await browser.text("#would-create") == "0"


async def test_schedules_read_in_words_and_trigger_now(
    daemon: DaemonProcess, browser: Browser
) -> None:
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/schedules")
    berlin = await browser.text("#schedule-berlin")
    assert "at 06:30, Monday to Friday (Europe/Berlin time)" in berlin, berlin
    # each next fire on Berlin's wall clock beside the same instant in UTC
    rows = await browser.finds("#schedule-berlin .next-fires tbody tr")
    assert len(rows) == 5
    local, utc = (await browser.call(lambda: rows[0].text)).split()
    assert local[11:16] == "06:30" and local[19:] in ("+01:00", "+02:00"), local
    offset = 1 if local.endswith("+01:00") else 2
    assert utc == f"{local[:10]}T{6 - offset:02d}:30:00Z", (local, utc)
    # trigger now: the dry run names the period that started last (a past weekday 06:30 in
    # Berlin: the daemon, started later with no grace, never fired it), then creates its run
    await browser.click(await browser.find("#trigger-berlin"))
    await browser.wait_for_text("creates the run berlin:")
    await browser.screenshot("trigger-dry-run")
    await browser.click(await browser.find("#confirm"))
    outcome = await browser.text("#outcome")
    assert "run berlin:" in outcome and "created" in outcome, outcome
    await browser.get("/console/schedules")
    assert "api" in await browser.text("#schedule-berlin .receipts")
    # again: the same period, found existing, nothing new
    await browser.click(await browser.find("#trigger-berlin"))
    await browser.wait_for_text("already has its run")
    await browser.screenshot("schedules")


async def test_a_read_only_token_sees_no_action_and_is_refused(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    await until_state(daemon, await enqueue(daemon, "dead-one", target), "dead")
    await browser.sign_in(VIEWER_TOKEN)
    assert "read-only" in await browser.page_text()
    for path in ("/console/", "/console/dead", "/console/schedules"):
        await browser.get(path)
        for action in ("Pause", "Redrive", "Retry", "Discard", "Dry run"):
            assert not await browser.call(
                lambda a=action: browser.driver.find_elements("link text", a)
            ), (path, action)
    await browser.get("/console/queues/default/pause")
    assert "read-only" in await browser.page_text()
    # posting anyway, with this session's own CSRF token (from its sign-out form)
    status = await browser.async_script(
        "const done = arguments[arguments.length - 1];"
        "const csrf = document.querySelector('input[name=csrf]').value;"
        "const body = new URLSearchParams({csrf});"
        "fetch('/console/queues/default/pause', {method: 'POST', body})"
        ".then(r => done(r.status), () => done(-1));"
    )
    assert status == 403
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{daemon.base_url}/v1/queues", headers=AUTH) as r,
    ):
        assert not (await r.json())["queues"][0]["paused"]


async def test_a_hostile_job_is_shown_as_inert_text(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    jid = await enqueue(daemon, HOSTILE_KEY, target, payload=HOSTILE_PAYLOAD, tenant=HOSTILE_TENANT)
    await until_state(daemon, jid, "dead")
    await browser.sign_in(OPERATOR_TOKEN)
    for path in (f"/console/jobs/{jid}", "/console/jobs", "/console/dead"):
        await browser.get(path)
        assert await browser.script("return window.__pwned === undefined") is True, path
        assert not await browser.finds("main script, main img"), path
    await browser.get(f"/console/jobs/{jid}")
    assert await browser.text("#job-key") == HOSTILE_KEY
    assert "<script>window.__pwned='payload'</script>" in await browser.text("#payload")
    assert HOSTILE_ERROR in await browser.text("#job-error")
    assert "\\u001b[31m\\u202eevil" in await browser.text("#job-tenant")
    await browser.screenshot("hostile-job")


async def test_readable_at_320_px_and_by_keyboard(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    jid = await enqueue(daemon, "narrow", target, payload={"long": "x" * 400})
    await until_state(daemon, jid, "dead")
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.resize(320, 900)
    inner = await browser.script("return window.innerWidth")
    assert inner <= 320, inner
    for name, path in (
        ("overview", "/console/"),
        ("jobs", "/console/jobs"),
        ("job", f"/console/jobs/{jid}"),
        ("dead", "/console/dead"),
        ("schedules", "/console/schedules"),
    ):
        await browser.get(path)
        overflow = await browser.script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, (path, overflow)  # tables scroll inside their own region
        await browser.screenshot(f"320px-{name}")
    await browser.resize(1280, 1000)
    await browser.get("/console/")
    # the first Tab reaches the skip link, Enter moves to the content
    from selenium.webdriver.common.keys import Keys

    body = await browser.find("body")
    await browser.call(body.send_keys, Keys.TAB)
    assert await browser.script("return document.activeElement.textContent") == "Skip to content"
    labels = await browser.script(
        "return [...document.querySelectorAll('input:not([type=hidden]), select')]"
        ".filter(e => !e.labels || e.labels.length === 0).length"
    )
    assert labels == 0


def screenshot_target() -> Path | None:
    wanted = os.environ.get("CONSOLE_SCREENSHOT")
    return Path(wanted) if wanted else None


async def test_change_a_queues_limits_and_window_then_reset(
    daemon: DaemonProcess, browser: Browser
) -> None:
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.click(await browser.find('a.details[href="/console/queues/default"]'))
    assert (await browser.text("h1")).startswith("Queue default")
    assert await browser.text('td[data-source="rate_per_s"]') == "file"
    assert await browser.text("#window") == "no windows: claims at any time"
    await browser.type_into("#in-rate_per_s", "25")
    await browser.type_into("#in-windows", "Mon-Fri 18:00-07:00 Europe/Berlin")
    await browser.click(await browser.find("#change"))
    await browser.wait_for_text("Change queue default?")
    text = await browser.page_text()
    assert "Change queue default?" in text and "rate_per_s: 1000.0 → 25.0" in text
    await browser.click(await browser.find("#confirm"))
    assert "Queue default: settings changed." in await browser.text("#outcome")
    await browser.click(await browser.link("Queue default"))
    assert await browser.text('td[data-source="rate_per_s"]') == "override"
    assert await browser.text('td[data-setting="rate_per_s"]') == "25.0"
    assert (await browser.text("#window")).startswith(("closed, opens", "open, closes"))
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{daemon.base_url}/v1/queues", headers=AUTH) as r,
    ):
        (view,) = [q for q in (await r.json())["queues"] if q["name"] == "default"]
    assert view["settings"]["rate_per_s"] == {"value": 25.0, "source": "override", "file": 1000.0}
    await browser.screenshot("queue-page")

    await browser.click(await browser.find("#reset"))
    await browser.wait_for_text("rate_per_s: 25.0 → 1000.0 (the file's)")
    await browser.click(await browser.find("#confirm"))
    assert "Queue default: settings reset." in await browser.text("#outcome")
