"""Live console pages in a real headless Chromium against a real daemon (static/live.js): the
job list, the job page, the dead letters, the queue page and the schedules page refresh
themselves while visible, keep the ticked checkboxes, the scroll position and the focus, stop
when paused (remembered by the browser) or hidden, and say "stale since" when a refresh fails;
pausing and resuming a schedule from its page; the Content-Security-Policy stays strict."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from dispatcher.console.toolkit import SECURITY_HEADERS
from tests.console.browser import Browser, needs_chromium
from tests.console.common import OPERATOR_TOKEN, TOKENS_ENV, page, session, sign_in
from tests.harness import DaemonProcess, Target, serve_target, wait_until

pytestmark = needs_chromium
AUTH = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
EVERY_S = 5  # live.js refreshes every 5 s
# Long enough for two refreshes: a page that should not refresh in this time did not.
QUIET_S = 2 * EVERY_S + 2


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    """Answers 400 (the job dies at once) to keys starting with 'bad', holds keys starting with
    'hold' until `target.release` is set, and answers 200 otherwise."""
    release = asyncio.Event()

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        key = request.headers.get("Idempotency-Key", "")
        if key.startswith("bad"):
            return web.Response(status=400, text="refused")
        if key.startswith("hold") or ":" in key:  # schedule units: run_key:unit
            await release.wait()
        return web.json_response({"ok": True})

    async with serve_target(Target(respond=respond)) as t:
        t.release = release  # type: ignore[attr-defined]
        try:
            yield t
        finally:
            release.set()  # nothing held when the target stops


@pytest.fixture
def daemon_env(tmp_path: Path, target: Target) -> dict[str, str]:
    config = tmp_path / "dispatcher.toml"
    config.write_text(
        '[[schedules]]\nname = "hourly"\ncron = "0 * * * *"\nhandler = "http"\n'
        f'overlap = "allow"\ntarget = {{ url = "{target.url}" }}\n'
    )
    return {
        "DISPATCHER_API_TOKENS": TOKENS_ENV,
        "DISPATCHER_DRAIN_TIMEOUT_S": "5",
        "DISPATCHER_CONFIG": str(config),
    }


@pytest.fixture
def browser(daemon: DaemonProcess, tmp_path: Path) -> Iterator[Browser]:
    b = Browser(daemon.base_url, tmp_path / "profile", tmp_path / "screenshots")
    b.driver.set_script_timeout(QUIET_S + 30)
    try:
        yield b
    finally:
        b.close()


async def enqueue(daemon: DaemonProcess, key: str, target: Target) -> int:
    status, body = await daemon.request(
        "POST",
        "/v1/jobs",
        json={"handler": "http", "target": {"url": target.url}},
        headers={**AUTH, "Idempotency-Key": key},
    )
    assert status == 202, body
    return int(body["id"])


async def until_state(daemon: DaemonProcess, jid: int, state: str) -> None:
    async def reached() -> bool:
        _, body = await daemon.request("GET", f"/v1/jobs/{jid}", headers=AUTH)
        return bool(body["state"] == state)

    await wait_until(reached, what=f"job {jid} {state}")


async def shown_text(browser: Browser, css: str) -> str:
    """The text of every element `css` finds, read in one step (a refresh may replace the
    elements between a lookup and a read)."""
    text = await browser.script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText).join(' ')",
        css,
    )
    return str(text)


async def until_shown(browser: Browser, css: str, text: str, *, absent: bool = False) -> None:
    """Wait (without reloading: the page must refresh itself) until `css` shows `text`."""

    async def shown() -> bool:
        found = text in await shown_text(browser, css)
        return found != absent

    await wait_until(shown, timeout_s=4 * EVERY_S + 10, interval_s=0.25, what=f"{text!r} in {css}")


async def same_document(browser: Browser) -> bool:
    """Whether the page is still the one marked by `mark` (no reload, no navigation)."""
    return bool(await browser.script("return window.__marked === true"))


async def mark(browser: Browser) -> None:
    await browser.script("window.__marked = true")


async def fetches(browser: Browser) -> int:
    """How many refreshes the page's script has started (live.js counts them on its bar)."""
    count = await browser.script("return document.getElementById('live-bar').dataset.fetches")
    return int(count or 0)


async def quiet(browser: Browser) -> None:
    """Let QUIET_S pass in the page (a negative check: nothing may happen meanwhile)."""
    await browser.async_script(
        "const done = arguments[arguments.length - 1]; setTimeout(done, arguments[0]);",
        QUIET_S * 1000,
    )


async def hide(browser: Browser, hidden: bool) -> None:
    """What the Page Visibility API reports when a tab is put in the background (headless
    Chromium has no background tab: the document's properties are overridden)."""
    await browser.script(
        "const h = arguments[0];"
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => h});"
        "Object.defineProperty(document, 'visibilityState', {configurable: true,"
        " get: () => h ? 'hidden' : 'visible'});"
        "document.dispatchEvent(new Event('visibilitychange'));",
        hidden,
    )


async def test_the_job_list_refreshes_keeping_selection_scroll_and_focus(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    # a paused queue: the jobs wait as ready until it is resumed
    status, _ = await daemon.request("POST", "/v1/queues/default/pause", headers=AUTH)
    assert status == 200
    ids = [await enqueue(daemon, f"job-{n:02d}", target) for n in range(40)]
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.resize(1000, 600)
    await browser.get("/console/jobs?limit=50")
    await until_shown(browser, "#job-list tbody", "ready")
    await mark(browser)
    picked = [ids[3], ids[20]]
    for jid in picked:
        await browser.click(await browser.find(f'#job-list input[name=id][value="{jid}"]'))
    # the last ticked box keeps the focus; the window is scrolled down to it
    await browser.script("window.scrollTo(0, 400)")
    scrolled = await browser.script("return window.scrollY")
    assert scrolled > 0
    assert await browser.script("return document.activeElement.value") == str(ids[20])

    status, _ = await daemon.request("POST", "/v1/queues/default/resume", headers=AUTH)
    assert status == 200
    await until_shown(browser, "#job-list tbody", "ready", absent=True)
    await until_shown(browser, "#job-list tbody", "succeeded")
    assert await same_document(browser)  # refreshed in place, not reloaded
    assert await fetches(browser) >= 1
    checked = await browser.script(
        "return [...document.querySelectorAll('#job-list input[name=id]:checked')]"
        ".map(e => Number(e.value))"
    )
    assert sorted(checked) == sorted(picked)
    assert await browser.script("return window.scrollY") == scrolled
    assert await browser.script("return document.activeElement.value") == str(ids[20])
    assert "Live: updated" in await shown_text(browser, "#live-status")


async def test_pause_stops_refreshing_and_is_remembered(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/dead")
    toggle = await browser.find("#live-toggle")
    assert await browser.call(lambda: toggle.text) == "Pause live updates"
    await browser.click(toggle)
    assert await browser.call(lambda: toggle.get_attribute("aria-pressed")) == "true"
    # remembered by the browser: a new page load starts paused
    await browser.get("/console/dead")
    await mark(browser)
    assert await shown_text(browser, "#live-toggle") == "Resume live updates"
    assert "paused" in await shown_text(browser, "#live-status")
    jid = await enqueue(daemon, "bad-while-paused", target)
    await until_state(daemon, jid, "dead")
    await quiet(browser)
    assert await fetches(browser) == 0
    assert "bad-while-paused" not in await shown_text(browser, "#main")

    await browser.click(await browser.find("#live-toggle"))  # resume: refreshes at once
    await until_shown(browser, "[data-live-region=dead-newest]", "bad-while-paused")
    assert await same_document(browser)
    assert await shown_text(browser, "#live-toggle") == "Pause live updates"


async def test_a_hidden_tab_stops_refreshing_the_queue_page(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    status, _ = await daemon.request("POST", "/v1/queues/default/pause", headers=AUTH)
    assert status == 200
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/queues/default")
    await mark(browser)
    assert "0 ready" in await shown_text(browser, "[data-live-region=queue-facts]")
    await enqueue(daemon, "first", target)
    await until_shown(browser, "[data-live-region=queue-facts]", "1 ready")

    await hide(browser, True)
    assert await browser.script("return document.getElementById('live-bar').dataset.state") == (
        "hidden"
    )
    before = await fetches(browser)
    await enqueue(daemon, "second", target)
    await quiet(browser)
    assert await fetches(browser) == before
    assert "1 ready" in await shown_text(browser, "[data-live-region=queue-facts]")

    await hide(browser, False)  # visible again: refreshed at once, then every few seconds
    await until_shown(browser, "[data-live-region=queue-facts]", "2 ready")
    assert await same_document(browser)


async def test_the_job_page_follows_a_running_job_but_keeps_a_selection(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    jid = await enqueue(daemon, "hold-1", target)
    await until_state(daemon, jid, "running")
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get(f"/console/jobs/{jid}")
    await mark(browser)
    assert "running" in await shown_text(browser, "h1")
    assert "Cancel" in await shown_text(browser, "[data-live-region=job-actions]")

    # text selected on the page (to copy it): the refresh waits rather than lose it
    await browser.script(
        "const range = document.createRange();"
        "range.selectNodeContents(document.getElementById('job-key'));"
        "getSelection().removeAllRanges(); getSelection().addRange(range);"
    )
    target.release.set()  # type: ignore[attr-defined]
    await until_state(daemon, jid, "succeeded")
    await quiet(browser)
    assert "running" in await shown_text(browser, "h1")
    assert await browser.script("return getSelection().toString()") == "hold-1"

    await browser.script("getSelection().removeAllRanges()")
    await until_shown(browser, "h1", "succeeded")
    await until_shown(browser, "#attempts", "succeeded")
    assert await same_document(browser)
    assert "Cancel" not in await shown_text(browser, "main")


async def test_a_failed_refresh_says_stale_since_and_keeps_the_page(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    jid = await enqueue(daemon, "bad-1", target)
    await until_state(daemon, jid, "dead")
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/jobs")
    await mark(browser)
    # the session ends on the server (signed out elsewhere): the next refresh is refused
    status = await browser.async_script(
        "const done = arguments[arguments.length - 1];"
        "const form = document.querySelector('form[action$=\"/logout\"]');"
        "fetch(form.action, {method: 'POST', body: new URLSearchParams(new FormData(form)),"
        " redirect: 'manual'}).then(r => done(r.type), () => done('failed'));"
    )
    assert status == "opaqueredirect"
    await wait_until(
        lambda: browser.script("return document.getElementById('live-bar').dataset.stale"),
        timeout_s=4 * EVERY_S,
        interval_s=0.25,
        what="the stale note",
    )
    note = await shown_text(browser, "#live-status")
    assert note.startswith("Stale since ") and note[12:14].isdigit() and note[14] == ":", note
    assert await same_document(browser)
    assert "bad-1" in await shown_text(browser, "#job-list")  # what was shown stays


async def test_pause_and_resume_a_schedule_and_watch_its_last_run(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/schedules")
    await browser.click(await browser.find("#pause-hourly"))
    await browser.wait_for_text("Pause schedule hourly?")
    await browser.click(await browser.find("#confirm"))
    assert "Schedule hourly: paused." in await browser.text("#outcome")
    await browser.get("/console/schedules")
    assert "paused" in await shown_text(browser, "#h-hourly")
    _, listed = await daemon.request("GET", "/v1/schedules", headers=AUTH)
    assert [s["paused"] for s in listed["schedules"] if s["name"] == "hourly"] == [True]
    await browser.click(await browser.find("#resume-hourly"))
    await browser.click(await browser.find("#confirm"))
    assert "Schedule hourly: resumed." in await browser.text("#outcome")

    # trigger the current period; its unit is held by the target, then finishes: the page's
    # last runs follow it without a reload
    await browser.get("/console/schedules")
    await browser.click(await browser.find("#trigger-hourly"))
    await browser.click(await browser.find("#confirm"))
    assert "run hourly:" in await browser.text("#outcome")  # created (or fired already)
    await browser.get("/console/schedules")
    await mark(browser)
    assert "enabled" in await shown_text(browser, "#h-hourly")
    row = "#schedule-hourly .receipts tbody tr:first-child"
    await until_shown(browser, f"{row} td:nth-child(7)", "1")  # pending
    target.release.set()  # type: ignore[attr-defined]
    await until_shown(browser, f"{row} td:nth-child(5)", "1")  # succeeded
    assert await shown_text(browser, f"{row} td:nth-child(7)") == "0"
    assert await same_document(browser)


async def test_the_csp_stays_strict_and_live_js_is_a_static_file(daemon: DaemonProcess) -> None:
    async with session() as client:
        await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        for path in ("/console/jobs", "/console/dead", "/console/schedules"):
            status, html, headers = await page(client, daemon.base_url + path)
            assert status == 200, path
            csp = headers["Content-Security-Policy"]
            assert csp == SECURITY_HEADERS["Content-Security-Policy"], csp
            assert "unsafe" not in csp and "script-src 'self'" in csp
            assert '<script src="/console/static/live.js" defer></script>' in html
            assert "<script>" not in html  # no inline script
        async with client.get(daemon.base_url + "/console/static/live.js") as r:
            assert r.status == 200
            assert r.content_type in ("application/javascript", "text/javascript")
            assert "data-live-region" in await r.text()
