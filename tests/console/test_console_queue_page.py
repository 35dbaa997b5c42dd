"""The console's queue page over real HTTP on a real daemon (real PostgreSQL): limits with their
source, the run-window state, the priority mix and the most waiting tenants; a run-time change
and its reset behind the confirm step (nothing changes before the POST, a bad value changes
nothing), and a read-only token that sees no form and is refused if it posts."""

from __future__ import annotations

import json

import aiohttp
import asyncpg
import pytest

from tests.console.common import (
    OPERATOR_TOKEN,
    TOKENS_ENV,
    VIEWER_TOKEN,
    form_token,
    page,
    session,
)
from tests.console.common import sign_in as console_sign_in
from tests.harness import DaemonHandle, Target, serve_target, wait_until

QUEUE_URL = "/console/queues/default"


@pytest.fixture
def daemon_env() -> dict[str, str]:
    return {"DISPATCHER_API_TOKENS": TOKENS_ENV}


async def overrides(db_url: str) -> dict[str, object]:
    conn = await asyncpg.connect(db_url)
    try:
        value = await conn.fetchval(
            "SELECT overrides FROM dispatcher.queues WHERE name = 'default'"
        )
        return json.loads(value) if isinstance(value, str) else dict(value)
    finally:
        await conn.close()


async def test_the_page_shows_limits_sources_window_priorities_and_tenants(
    daemon: DaemonHandle, db_url: str
) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "UPDATE dispatcher.queues SET paused = true, paused_at = now() WHERE name = 'default'"
        )
        for i, (tenant, priority) in enumerate(
            [("acme", -10), ("acme", 0), ("acme", 0), ("globex", 5), ("acme", 5)]
        ):
            await conn.execute(
                "SELECT dispatcher.enqueue($1, 'http', tenant => $2, priority => $3,"
                ' target => \'{"url": "http://127.0.0.1:9/"}\')',
                f"k{i}",
                tenant,
                priority,
            )
    finally:
        await conn.close()
    async with session() as client:
        await console_sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        status, html, _ = await page(client, daemon.base_url + "/console/")
        assert f'href="{QUEUE_URL}"' in html
        status, html, _ = await page(client, daemon.base_url + QUEUE_URL)
        assert status == 200
        assert 'data-source="rate_per_s" class="">file<' in html
        assert "no windows: claims at any time" in html
        for priority, n in ((-10, 1), (0, 2), (5, 2)):  # each count links to its jobs
            link = f"/console/jobs?queue=default&amp;state=ready&amp;priority={priority}"
            assert f'<td class="num">{priority}</td><td class="num"><a href="{link}"' in html
            assert f'aria-label="ready jobs of priority {priority}">{n}</a>' in html
        assert html.index('tenant acme">4</a>') < html.index('tenant globex">1</a>')
        assert '/console/jobs?queue=default&amp;state=ready">5 ready</a>' in html


async def test_a_change_waits_for_the_confirm_step_and_a_reset_undoes_it(
    daemon: DaemonHandle, db_url: str
) -> None:
    async with session() as client:
        await console_sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        ask = (
            f"{daemon.base_url}{QUEUE_URL}/settings?rate_per_s=20&burst=&max_inflight="
            "&windows=Mon-Fri+18%3A00-07%3A00+UTC"
        )
        status, html, _ = await page(client, ask)
        assert status == 200
        assert "rate_per_s: 1000.0 → 20.0" in html
        assert "windows: [] → [&#34;Mon-Fri 18:00-07:00 UTC&#34;]" in html
        assert await overrides(db_url) == {}  # nothing before the POST
        change = form_token(html, "change")
        async with client.post(
            daemon.base_url + QUEUE_URL + "/settings",
            data={"csrf": form_token(html), "change": change.replace("&#34;", '"')},
        ) as r:
            assert r.status == 200 and "Queue default: settings changed." in await r.text()
        assert await overrides(db_url) == {
            "rate_per_s": 20.0,
            "windows": ["Mon-Fri 18:00-07:00 UTC"],
        }
        _, html, _ = await page(client, daemon.base_url + QUEUE_URL)
        assert 'data-source="rate_per_s" class="override">override<' in html
        assert ("closed, opens" in html) or ("open, closes" in html)

        status, html, _ = await page(client, daemon.base_url + QUEUE_URL + "/reset")
        assert status == 200 and "rate_per_s: 20.0 → 1000.0 (the file&#39;s)" in html
        async with client.post(
            daemon.base_url + QUEUE_URL + "/reset", data={"csrf": form_token(html)}
        ) as r:
            assert r.status == 200 and "settings reset" in await r.text()
        assert await overrides(db_url) == {}


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("burst=0", "burst: Input should be greater than or equal to 1"),
        ("rate_per_s=fast", "rate_per_s: &#39;fast&#39; is not a number"),
        ("windows=Mon-Fry+18%3A00-07%3A00", "day &#39;Fry&#39;"),
    ],
)
async def test_a_bad_value_is_refused_naming_it(
    daemon: DaemonHandle, db_url: str, query: str, words: str
) -> None:
    async with session() as client:
        await console_sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        status, html, _ = await page(client, f"{daemon.base_url}{QUEUE_URL}/settings?{query}")
        assert status == 422 and words in html, html[-2000:]
    assert await overrides(db_url) == {}


async def test_a_read_only_token_sees_no_form_and_cannot_change(
    daemon: DaemonHandle, db_url: str
) -> None:
    async with session() as client:
        await console_sign_in(client, daemon.base_url, VIEWER_TOKEN)
        status, html, _ = await page(client, daemon.base_url + QUEUE_URL)
        assert status == 200 and "settings-form" not in html and "/reset" not in html
        status, _, _ = await page(client, daemon.base_url + QUEUE_URL + "/settings?burst=3")
        assert status == 403
        csrf = form_token((await page(client, daemon.base_url + "/console/"))[1])
        for path, data in (("/settings", {"change": '{"burst": 3}'}), ("/reset", {})):
            async with client.post(
                daemon.base_url + QUEUE_URL + path, data={"csrf": csrf, **data}
            ) as r:
                assert r.status == 403
    assert await overrides(db_url) == {}


async def test_an_unknown_queue_is_a_404_page(daemon: DaemonHandle) -> None:
    async with session() as client:
        await console_sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        status, html, _ = await page(client, daemon.base_url + "/console/queues/nope")
        assert status == 404 and "no queue &#39;nope&#39;" in html.lower()


async def test_the_keys_at_their_limit_are_listed(daemon: DaemonHandle) -> None:
    auth = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    async with serve_target(Target(delay_s=3)) as target, aiohttp.ClientSession() as api:
        async with api.patch(
            f"{daemon.base_url}/v1/queues/default", json={"key_max_inflight": 1}, headers=auth
        ) as r:
            assert r.status == 200, await r.text()
        for i, tenant in enumerate(["acct-1", "acct-1", "acct-2", "acct-2"]):
            body = {"handler": "http", "target": {"url": target.url}, "tenant": tenant}
            async with api.post(
                f"{daemon.base_url}/v1/jobs",
                json=body,
                headers={**auth, "Idempotency-Key": f"k{i}"},
            ) as r:
                assert r.status == 202, await r.text()
        await wait_until(lambda: len(target.requests) == 2, what="one job of each key running")
        async with session() as client:
            await console_sign_in(client, daemon.base_url, OPERATOR_TOKEN)
            _, html, _ = await page(client, daemon.base_url + QUEUE_URL)
        assert "2 keys may start nothing now" in html
        assert '<ul id="keys"><li>acct-1</li><li>acct-2</li></ul>' in html
        assert len(target.requests) == 2  # each key's second job waits for its first
