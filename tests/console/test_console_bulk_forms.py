"""The job list's bulk actions as plain HTML forms, with no JavaScript at all (a real daemon,
real HTTP): the list's checkboxes belong to the bulk form, its GET shows the dry run and a
form whose POST acts, the key on that form makes a second POST act no more, and a read-only
token gets 403 at both steps."""

from __future__ import annotations

import re

import pytest

from tests.console.common import (
    OPERATOR_TOKEN,
    TOKENS_ENV,
    VIEWER_TOKEN,
    form_token,
    page,
    session,
    sign_in,
)
from tests.harness import DaemonHandle

AUTH = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.fixture
def daemon_env() -> dict[str, str]:
    return {"DISPATCHER_API_TOKENS": TOKENS_ENV}


async def later_job(daemon: DaemonHandle, key: str) -> int:
    body = {"handler": "http", "target": {"url": "https://hooks.example.com/x"},
            "due_at": "2031-05-31T00:00:00Z"}  # fmt: skip
    status, doc = await daemon.request(
        "POST", "/v1/jobs", json=body, headers={**AUTH, "Idempotency-Key": key}
    )
    assert status == 202, doc
    return int(doc["id"])


async def test_the_forms_work_without_javascript(daemon: DaemonHandle) -> None:
    first, second = await later_job(daemon, "a"), await later_job(daemon, "b")
    base = daemon.base_url
    async with session() as client:
        await sign_in(client, base, OPERATOR_TOKEN)
        status, html, _ = await page(client, f"{base}/console/jobs")
        assert status == 200
        assert f'name="id" value="{first}" form="bulk-form"' in html
        assert '<form method="get" action="/console/jobs/bulk" id="bulk-form"' in html

        # what the browser sends for the bar with one box ticked
        query = f"action=run_now&scope=selected&id={first}&due_at="
        status, html, _ = await page(client, f"{base}/console/jobs/bulk?{query}")
        assert status == 200, html
        assert '<strong id="dry-run-count">1</strong>' in html
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', html))
        assert fields["ids"] == str(first) and fields["bulk_key"].startswith("console-")

        for attempt in ("acts", "acts no more"):
            async with client.post(f"{base}/console/jobs/bulk", data=fields) as r:
                done = await r.text()
            assert r.status == 200, done
            assert "Run now: 1 of 1 jobs run now" in done, (attempt, done)
        assert "sent before: nothing more done" in done
        status, job = await daemon.request("GET", f"/v1/jobs/{first}", headers=AUTH)
        assert job["state"] in ("ready", "running", "succeeded", "scheduled", "dead")
        assert job["state"] != "scheduled" or job["attempt"] > 0
        status, untouched = await daemon.request("GET", f"/v1/jobs/{second}", headers=AUTH)
        assert untouched["state"] == "scheduled"

    async with session() as viewer:
        await sign_in(viewer, base, VIEWER_TOKEN)
        status, html, _ = await page(viewer, f"{base}/console/jobs")
        assert 'name="id"' not in html and "bulk-form" not in html
        status, _, _ = await page(viewer, f"{base}/console/jobs/bulk?{query}")
        assert status == 403
        async with viewer.post(
            f"{base}/console/jobs/bulk", data={**fields, "csrf": form_token(html)}
        ) as r:
            assert r.status == 403
