"""The history charts in a real headless Chromium against a real daemon (issue 26, point 1):
the overview and the queue page draw, from the cluster-wide history, a jobs chart and a latency
chart with axes and tick labels, a legend (started, succeeded, retried, dead; p50, p95) and one
hover title per step with its values; the range links switch to 24 hours and 7 days; the charts
refresh themselves (console.js) without a reload; nothing needs inline script."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from dispatcher.console.toolkit import SECURITY_HEADERS
from tests.console.browser import Browser, needs_chromium
from tests.console.common import OPERATOR_TOKEN, TOKENS_ENV, page, session, sign_in
from tests.harness import DaemonProcess, Target, serve_target, wait_until

pytestmark = needs_chromium
AUTH = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
# the charts' screenshot for the docs goes here when set (the daemon's own settings take every
# DISPATCHER_* name, so this one has another prefix)
SHOTS = os.environ.get("CHARTS_SCREENSHOT_DIR")


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    """Answers 400 (the job dies at once) to keys starting with 'bad', 200 otherwise."""

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        if request.headers.get("Idempotency-Key", "").startswith("bad"):
            return web.Response(status=400, text="refused")
        return web.json_response({"ok": True})

    async with serve_target(Target(respond=respond)) as t:
        yield t


@pytest.fixture
def daemon_env() -> dict[str, str]:
    return {"DISPATCHER_API_TOKENS": TOKENS_ENV}


async def run_jobs(daemon: DaemonProcess, target: Target, prefix: str, n: int) -> None:
    for i in range(n):
        status, body = await daemon.request(
            "POST",
            "/v1/jobs",
            json={"handler": "http", "target": {"url": target.url}},
            headers={**AUTH, "Idempotency-Key": f"{prefix}-{i}"},
        )
        assert status == 202, body


async def recorded(daemon: DaemonProcess, started: int) -> None:
    """Wait until the history (every daemon's flushes) holds `started` starts."""

    async def enough() -> bool:
        _, body = await daemon.request("GET", "/v1/history", headers=AUTH)
        return sum(p["started"] for p in body["points"]) >= started

    await wait_until(enough, timeout_s=30, interval_s=0.25, what=f"{started} starts recorded")


async def chart_facts(browser: Browser, kind: str) -> dict[str, object]:
    """What one chart shows, read in one step (a refresh may swap it meanwhile)."""
    facts = await browser.script(
        """const svg = document.querySelector(`svg[data-chart="${arguments[0]}"]`);
        if (!svg) { return null; }
        const texts = sel => [...svg.querySelectorAll(sel)].map(e => e.textContent);
        return {ticks: texts('.axis text.tick'), legend: texts('.legend text'),
                titles: texts('.hover title'), lines: svg.querySelectorAll('polyline').length,
                width: svg.getBoundingClientRect().width};""",
        kind,
    )
    assert facts is not None, f"no {kind} chart on {await browser.path()}"
    return dict(facts)


async def test_the_charts_have_axes_a_legend_and_hover_values(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    await run_jobs(daemon, target, "ok", 12)
    await run_jobs(daemon, target, "bad", 3)
    await recorded(daemon, 15)
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/")
    counts = await chart_facts(browser, "counts")
    assert counts["legend"] == ["started", "succeeded", "retried", "dead"]
    assert len(counts["ticks"]) >= 8  # y: 0 .. top in quarters; x: every 3 minutes
    assert "0" in counts["ticks"] and any(":" in str(t) for t in counts["ticks"])
    titles = [str(t) for t in counts["titles"]]  # type: ignore[attr-defined]
    assert len(titles) == 15  # one per minute of the last 15
    # this minute, or the one before if the jobs ran across a minute's end
    assert sum(int(t.split("started ")[1].split(",")[0]) for t in titles) == 15
    assert "dead" in titles[-1] and "Z (+1 min)" in titles[-1]
    assert counts["lines"] == 4 and float(counts["width"]) > 200  # type: ignore[arg-type]
    latency = await chart_facts(browser, "latency")
    assert latency["legend"] == ["p50", "p95"]
    assert any(str(t).endswith("ms") or str(t).endswith(" s") for t in latency["ticks"])  # type: ignore[attr-defined]
    assert any("p95 ≤" in str(t) for t in latency["titles"])  # type: ignore[attr-defined]
    await browser.screenshot("overview-charts")
    if SHOTS:  # the docs' picture: the charts section alone
        section = await browser.find("#history")
        await browser.call(section.screenshot, str(Path(SHOTS) / "console-history.png"))

    # the queue page: the same charts of its own queue, and the other ranges
    await browser.get("/console/queues/default")
    assert len((await chart_facts(browser, "counts"))["titles"]) == 15  # type: ignore[arg-type]
    await browser.click(await browser.link("24 hours"))
    await wait_until(lambda: browser_path_has(browser, "range=24h"), what="the 24-hour range")
    day = await chart_facts(browser, "counts")
    assert len(day["titles"]) == 96 and "(+15 min)" in str(day["titles"][-1])  # type: ignore[index, arg-type]
    await browser.click(await browser.link("7 days"))
    await wait_until(lambda: browser_path_has(browser, "range=7d"), what="the 7-day range")
    assert len((await chart_facts(browser, "counts"))["titles"]) == 84  # type: ignore[arg-type]


async def browser_path_has(browser: Browser, text: str) -> bool:
    url = await browser.script("return location.search")
    return text in str(url)


async def test_the_charts_refresh_without_a_reload(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/")
    await browser.script("document.getElementById('history').dataset.marker = 'same page'")
    before = await browser.text("#history-totals")
    assert before.startswith("0 started"), before
    await run_jobs(daemon, target, "later", 5)
    await recorded(daemon, 5)

    async def refreshed() -> bool:
        text = await browser.script("return document.getElementById('history-totals').textContent")
        return str(text).startswith("5 started")

    await wait_until(refreshed, timeout_s=30, interval_s=0.5, what="the charts refreshed")
    marker = await browser.script("return document.getElementById('history').dataset.marker")
    assert marker == "same page"  # swapped in place, not reloaded


async def test_the_charts_need_no_inline_script(daemon: DaemonProcess) -> None:
    csp = SECURITY_HEADERS["Content-Security-Policy"]
    assert "script-src 'self';" in csp and "unsafe-inline" not in csp
    async with session() as client:
        await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        for path in ("/console/", "/console/queues/default", "/console/charts?range=7d"):
            status, html, _ = await page(client, daemon.base_url + path)
            assert status == 200 and "<svg" in html
            assert "<script>" not in html and " style=" not in html and "onload" not in html
        status, html, _ = await page(client, daemon.base_url + "/console/charts?range=1y")
        assert status == 400 and "range must be one of 15m, 24h, 7d" in html
