"""The job list's key-prefix search with many matches, in a real headless Chromium against a
daemon: the first page shows the matches among the newest jobs and says so, and its "Search
older jobs" link, followed to the end, shows every match once, newest first. The daemon runs in
this process so that the bounds can be made small (20 matches, slices of 50 ids: 400 jobs show
every case); tests/service/test_api_prefix_slices.py checks the API's pages."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db import job_reads
from tests.console.browser import Browser, needs_chromium
from tests.console.common import OPERATOR_TOKEN, TOKENS_ENV
from tests.harness import DaemonHandle
from tests.harness.waits import wait_until

pytestmark = needs_chromium
JOBS = 400
MATCHING = [*range(1, 31), 200, *range(380, 386)]  # ids keyed acct-<id>; the others other-<id>
SEED = """
INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state, due_at,
       max_attempts, max_retry_age_s, budget_started_at, finished_at)
SELECT CASE WHEN g = ANY($2::int[]) THEN 'acct-' ELSE 'other-' END || g, md5(g::text),
       'default', 'http', '{}', 'succeeded', now(), 10, 86400, now(), now()
  FROM generate_series(1, $1::int) g
"""


@pytest.fixture
def daemon_env() -> dict[str, str]:
    return {"DISPATCHER_API_TOKENS": TOKENS_ENV}


@pytest.fixture
def daemon_in_process(monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(job_reads, "PREFIX_SCAN_IDS", 20)
    monkeypatch.setattr(job_reads, "PREFIX_SLICE_IDS", 50)
    return True


@pytest.fixture
async def seeded(daemon: DaemonHandle, db_url: str) -> DaemonHandle:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(SEED, JOBS, MATCHING)
        assert await conn.fetchval("SELECT max(id) FROM dispatcher.jobs") == JOBS
    finally:
        await conn.close()
    return daemon


async def shown_ids(browser: Browser) -> list[int]:
    """The listed ids, read in one script (the list may be drawn again between finding its
    cells and reading each one: a stale element)."""
    ids = await browser.script(
        "return Array.from(document.querySelectorAll('#job-list tbody td.num a'),"
        " a => a.innerText.trim())"
    )
    return [int(str(i)) for i in ids]


async def onward_link(browser: Browser) -> str | None:
    """The href of the page's "Search older jobs" or "Next page" link (None: neither)."""
    href = await browser.script(
        "const a = document.querySelector('#search-older, #next-page');"
        "return a ? a.getAttribute('href') : null;"
    )
    return None if href is None else str(href)


async def follow(browser: Browser, href: str) -> None:
    """Click the link to `href` and wait for its page."""
    await browser.click(await browser.find(f'a[href="{href}"]'))

    async def arrived() -> bool:
        return await browser.path() == href

    await wait_until(arrived, what=f"the page {href}")
    await browser.find("#job-list")


async def test_search_older_pages_through_every_match_newest_first(
    seeded: DaemonHandle, browser: Browser
) -> None:
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/jobs")
    await browser.type_into("#f-key_prefix", "acct-")
    await browser.click(await browser.find(".filters button[type=submit]"))
    await browser.find("#prefix-slice")
    assert await shown_ids(browser) == [385, 384, 383, 382, 381, 380]
    hint = await browser.text("#prefix-slice")
    assert "Showing the matches among the newest 50 jobs only" in hint, hint
    assert "Search older jobs" in hint, hint
    assert await browser.axe() == []

    seen = await shown_ids(browser)
    hints = [hint]
    while (href := await onward_link(browser)) is not None:
        await follow(browser, href)
        seen += await shown_ids(browser)  # none on a page whose slice held no match
        if await browser.script("return document.querySelector('#prefix-slice') !== null;"):
            hints.append(await browser.text("#prefix-slice"))
    assert seen == sorted(MATCHING, reverse=True)
    assert any("the jobs with ids 301 to 350 only" in h for h in hints), hints
