"""A job's contract shown by every view, on a real daemon: GET /v1/jobs/{id}, the console's job
page and `dispatcher jobs show` show its deadline, time to live, callback targets (masked: no
header value or query value of a callback is ever shown) and what key modes did to it, for a
job from the HTTP door and one from the SQL door."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from dispatcher.core import rfc3339
from tests.console.common import OPERATOR_TOKEN, TOKENS, page, session, sign_in
from tests.harness import cli, make_settings, running_daemon

NAP = "tests.e2e.contract_handlers:nap"
HANDLERS = {"nap": {"kind": "python", "function": NAP, "transactional": False, "timeout_s": 60}}
SECRET = "s3cret-value"
HOOK = {
    "url": f"https://hooks.example.com/done?token={SECRET}",
    "headers": {"Authorization": f"Bearer {SECRET}"},
}
MASKED_HOOK_URL = "https://hooks.example.com/done?token=•••"


def later(seconds: float) -> str:
    return rfc3339.format(datetime.now(UTC) + timedelta(seconds=seconds))


async def test_the_status_views_show_the_contract_and_never_a_callbacks_secret(
    db_url: str, tmp_path: Path
) -> None:
    expires = later(3600)
    first: dict[str, Any] = {
        "handler": "nap",
        "payload": {"n": 1},
        "due_at": later(600),
        "timeout_s": 5,
        "expires_at": expires,
        "on_success": HOOK,
        "on_key": "replace",
    }
    second = {**first, "payload": {"n": 2}, "due_at": later(900), "debounce_max_s": 120}
    settings = make_settings(db_url, handlers=HANDLERS, api_tokens=TOKENS)
    async with running_daemon(settings) as d:
        d.session.headers["Authorization"] = f"Bearer {OPERATOR_TOKEN}"
        ids = {}
        for body in (first, second):
            async with d.session.post(
                f"{d.base_url}/v1/jobs", json=body, headers={"Idempotency-Key": "deb"}
            ) as r:
                assert r.status == 202, await r.text()
                ids["http"] = (await r.json())["id"]
        conn = await asyncpg.connect(db_url)
        try:  # the SQL door: a plain job, then a throttling replacement with a contract
            await conn.fetchval(
                "SELECT dispatcher.enqueue('sql', 'nap', due_at => $1::text::timestamptz)",
                later(600),
            )
            ids["sql"] = await conn.fetchval(
                "SELECT dispatcher.enqueue('sql', 'nap', '{\"n\": 3}', due_at => $1,"
                " on_key => 'keep_due', on_failure => $2::text::jsonb, timeout_s => 2.5)",
                datetime.now(UTC) + timedelta(seconds=700),
                json.dumps(HOOK),
            )
        finally:
            await conn.close()

        views = {}
        for door, jid in ids.items():
            async with d.session.get(f"{d.base_url}/v1/jobs/{jid}") as r:
                text = await r.text()
                assert r.status == 200, text
            assert SECRET not in text, door
            views[door] = json.loads(text)
        http, sql = views["http"], views["sql"]
        assert (http["timeout_s"], http["expires_at"], http["on_failure"]) == (5, expires, None)
        assert http["on_success"]["url"] == MASKED_HOOK_URL
        assert http["on_success"]["headers"] == {"Authorization": "•••"}
        bound = datetime.fromisoformat(http["replaced"]["due_at_bound"])
        created = datetime.fromisoformat(http["created_at"])
        assert (http["replaced"]["on_key"], http["replaced"]["times"]) == ("replace", 1)
        assert bound - created == timedelta(seconds=120)
        assert datetime.fromisoformat(http["due_at"]) <= bound  # pulled in by the bound
        assert (sql["timeout_s"], sql["expires_at"], sql["on_success"]) == (2.5, None, None)
        assert sql["on_failure"]["url"] == MASKED_HOOK_URL
        assert sql["replaced"]["on_key"] == "keep_due"
        assert sql["replaced"]["due_at_bound"] is None

        async with session() as client:
            await sign_in(client, d.base_url, OPERATOR_TOKEN)
            status, html, _ = await page(client, f"{d.base_url}/console/jobs/{ids['http']}")
            assert status == 200, html[:500]
            assert SECRET not in html
            assert 'id="job-contract"' in html and "5 s per attempt" in html
            assert MASKED_HOOK_URL.replace("&", "&amp;") in html
            assert "replaced 1 time (on_key replace)" in html and "(debounce_max_s)" in html
            status, html, _ = await page(client, f"{d.base_url}/console/jobs/{ids['sql']}")
            assert "2.5 s per attempt" in html and "on_key keep_due" in html
            assert SECRET not in html

    env = {"DISPATCHER_DATABASE_URL": db_url}
    shown = await cli("jobs", "show", str(ids["http"]), "--json", cwd=tmp_path, env=env)
    assert shown.code == 0, shown.stderr
    assert SECRET not in shown.stdout
    assert json.loads(shown.stdout)["replaced"]["times"] == 1
    plain = await cli("jobs", "show", str(ids["sql"]), cwd=tmp_path, env=env)
    assert SECRET not in plain.stdout
    assert "timeout_s" in plain.stdout and "hooks.example.com/done?token=" in plain.stdout
