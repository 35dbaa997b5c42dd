"""Bulk actions from the console's job list in a real headless Chromium against a real daemon:
tick rows (one by one, or the whole page), or take every job matching the filter; pick the
action; the confirmation shows the dry-run count and what is skipped; confirm. Each of retry,
cancel, discard, reschedule and run now, on jobs the daemon really ran; a form sent twice acts
once; a read-only token gets no checkboxes."""

from __future__ import annotations

from pathlib import Path

from tests.console import test_console_browser as shared
from tests.console.browser import Browser, needs_chromium
from tests.console.common import OPERATOR_TOKEN, VIEWER_TOKEN
from tests.console.test_console_browser import enqueue, job_state, until_state
from tests.harness import DaemonProcess, Target

pytestmark = needs_chromium
# that module's daemon (a target that refuses until fixed), browser and target
daemon_env, target = shared.daemon_env, shared.target  # the browser: conftest.py
FAR = "2031-05-31T00:00:00Z"


async def review(browser: Browser, action: str, *, scope: str = "selected", due: str = "") -> str:
    """Choose `action` in the bar, which jobs, and open the confirmation; its dry-run count."""
    await browser.script("document.getElementById('bulk-action').value = arguments[0]", action)
    if due:
        await browser.type_into("#bulk-due", due)
    await browser.click(await browser.find(f"#scope-{scope}"))
    await browser.click(await browser.find("#bulk-review"))
    return await browser.text("#dry-run-count")


async def tick(browser: Browser, *ids: int) -> None:
    for job_id in ids:
        await browser.click(await browser.find(f'input[name="id"][value="{job_id}"]'))


async def test_each_bulk_action_from_the_job_list(
    daemon: DaemonProcess, browser: Browser, target: Target, tmp_path: Path
) -> None:
    dead = [await enqueue(daemon, f"dead-{n}", target) for n in range(3)]
    later = [await enqueue(daemon, f"later-{n}", target, due_at=FAR, tenant="later")
             for n in range(4)]  # fmt: skip
    for job_id in dead:
        await until_state(daemon, job_id, "dead")
    await browser.sign_in(OPERATOR_TOKEN)

    # discard two ticked dead jobs
    await browser.get("/console/jobs?state=dead")
    await tick(browser, dead[0], dead[1])
    assert await browser.text("#selected-count") == "2"
    await browser.screenshot("bulk-list")
    assert await review(browser, "discard") == "2"
    await browser.screenshot("bulk-dry-run")
    await browser.click(await browser.find("#confirm"))
    assert "Discard: 2 of 2 jobs discarded." in await browser.text("#outcome")
    assert [await job_state(daemon, j) for j in dead] == ["discarded", "discarded", "dead"]

    # retry the whole page of discarded jobs (the page's box ticks every row)
    target.fixed["fixed"] = True  # type: ignore[attr-defined]
    await browser.get("/console/jobs?state=discarded")
    await browser.click(await browser.find("#select-page"))
    assert await browser.text("#selected-count") == "2"
    assert await review(browser, "retry") == "2"
    await browser.click(await browser.find("#confirm"))
    assert "Retry: 2 of 2 jobs retried." in await browser.text("#outcome")
    await until_state(daemon, dead[0], "succeeded")
    await until_state(daemon, dead[1], "succeeded")

    # reschedule every job matching the filter; the same form sent again acts once
    await browser.get("/console/jobs?tenant=later")
    due = "2032-01-01T00:00:00Z"
    assert await review(browser, "reschedule", scope="matching", due=due) == "4"
    await browser.click(await browser.find("#confirm"))
    assert "Reschedule: 4 of 4 jobs rescheduled." in await browser.text("#outcome")
    await browser.call(browser.driver.back)
    await browser.click(await browser.find("#confirm"))
    assert "sent before: nothing more done" in await browser.text("#outcome")

    # run one ticked job now
    await browser.get("/console/jobs?tenant=later")
    await tick(browser, later[0])
    assert await review(browser, "run_now") == "1"
    await browser.click(await browser.find("#confirm"))
    await until_state(daemon, later[0], "succeeded")

    # cancel every job of the filter: the one that ran is skipped, with the reason shown
    await browser.get("/console/jobs?tenant=later")
    assert await review(browser, "cancel", scope="matching") == "3"
    assert "Skipped: 1 succeeded (only scheduled, ready or running" in await browser.page_text()
    await browser.click(await browser.find("#confirm"))
    assert "Cancel: 3 of 4 jobs cancelled; skipped 1 succeeded." in await browser.text("#outcome")
    assert [await job_state(daemon, j) for j in later[1:]] == ["cancelled"] * 3


async def test_nothing_ticked_is_explained_and_a_viewer_has_no_checkboxes(
    daemon: DaemonProcess, browser: Browser, target: Target
) -> None:
    await enqueue(daemon, "one", target, due_at=FAR)
    await browser.sign_in(OPERATOR_TOKEN)
    await browser.get("/console/jobs")
    await browser.click(await browser.find("#bulk-review"))
    await browser.wait_for_text("Tick the jobs to act on")
    await browser.click(await browser.find("form.inline button"))  # sign out
    await browser.sign_in(VIEWER_TOKEN)
    await browser.get("/console/jobs")
    assert "one" in await browser.page_text()
    assert await browser.finds('input[name="id"]') == []
    assert await browser.finds("#bulk-form") == []
