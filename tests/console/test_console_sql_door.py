"""Jobs stored through the SQL door or inserted directly, shown by every view: the console's job
page, lists and dead letters, GET /v1/jobs/{id}, and `dispatcher jobs show`.

The HTTP API stores a target normalised (method, headers, timeout); the SQL door and a direct
insert store it as given. The job page read `target.method` and answered 500 for the README's
own `dispatcher.enqueue` example (issue 20, defect 4). And a page loads at most 64 KiB of a
payload and says so (issue 20, defect 3: the SQL door takes payloads of any size).
"""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg

from tests.console.common import OPERATOR_TOKEN, TOKENS, page, session, sign_in
from tests.harness import cli, make_settings, running_daemon

URL = "https://portal.example.com/hooks/move-out"
# targets as a door that does not normalise them may store them, beside the README's own
TARGETS = {
    "readme": {"url": URL},
    "headers-not-an-object": {"url": URL, "headers": "Authorization: s3cret"},
    "url-not-text": {"url": 17, "method": ["PUT"], "timeout_s": "soon"},
    "no-url": {"headers": {"Authorization": "s3cret"}},
    "not-an-object": ["s3cret"],
    "none": None,
}
LARGE_PAYLOAD_CHARS = 200 * 1024


async def store(conn: asyncpg.Connection) -> dict[str, int]:
    """One job per target shape, waiting (far future) or dead, through dispatcher.enqueue where
    it accepts the target and a direct insert where it does not; and one 200 KiB payload."""
    ids: dict[str, int] = {}
    ids["readme"] = await conn.fetchval(
        """SELECT dispatcher.enqueue(
               key     => 'lease-4831:send-move-out-notice:2030-05-31',
               handler => 'http',
               payload => jsonb_build_object('lease_id', 4831, 'ends_on', '2030-05-31'),
               due_at  => '2030-05-24T09:00:00Z',
               target  => jsonb_build_object('url', $1::text))""",
        URL,
    )
    for name, target in TARGETS.items():
        if name == "readme":
            continue
        ids[name] = await conn.fetchval(
            """INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, target, payload,
                                            state, due_at, attempt, max_attempts,
                                            max_retry_age_s, budget_started_at, last_error,
                                            dead_reason, finished_at)
               VALUES ($1, 'direct', 'default', 'http', $2::jsonb, '{"n": 1}', 'dead', now(),
                       3, 3, 86400, now(), 'gone', 'max_attempts', now())
               RETURNING id""",
            f"direct-{name}",
            None if target is None else json.dumps(target),
        )
    ids["large"] = await conn.fetchval(
        "SELECT dispatcher.enqueue('large', 'http', jsonb_build_object('blob', repeat('L', $1)),"
        " due_at => now() + interval '1 day', target => jsonb_build_object('url', $2::text))",
        LARGE_PAYLOAD_CHARS,
        URL,
    )
    return ids


def expected_url(name: str) -> str | None:
    """What the status view shows of a target's URL: its text, whatever its JSON type."""
    target = TARGETS.get(name, {"url": URL})
    if not isinstance(target, dict) or "url" not in target:
        return None
    return str(target["url"])


async def test_every_view_shows_jobs_the_sql_door_stored(db_url: str, tmp_path: Path) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        ids = await store(conn)
    finally:
        await conn.close()
    async with running_daemon(make_settings(db_url, api_tokens=TOKENS)) as daemon:
        daemon.session.headers["Authorization"] = f"Bearer {OPERATOR_TOKEN}"
        async with session() as client:
            await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
            for name, jid in ids.items():
                status, html, _ = await page(client, f"{daemon.base_url}/console/jobs/{jid}")
                assert status == 200, (name, html[:500])
                assert "s3cret" not in html, name  # what may be a secret stays masked
                if isinstance(TARGETS.get(name), dict) and "url" in TARGETS[name]:
                    assert 'id="target-url"' in html, name
                async with daemon.session.get(f"{daemon.base_url}/v1/jobs/{jid}") as r:
                    assert r.status == 200, (name, await r.text())
                    view = await r.json()
                assert view["id"] == jid
                assert view["target_url"] == expected_url(name), name
            _, html, _ = await page(client, f"{daemon.base_url}/console/jobs/{ids['readme']}")
            assert f"POST {URL}" in html  # a target stored without a method is POSTed
            for path in ("/console/jobs", "/console/dead", "/console/jobs?state=dead"):
                status, html, _ = await page(client, daemon.base_url + path)
                assert status == 200, (path, html[:500])
            status, html, _ = await page(client, f"{daemon.base_url}/console/jobs/{ids['large']}")
            assert status == 200
            assert 'id="payload-cut"' in html and "65536 characters of" in html
            assert f"WHERE id = {ids['large']}" in html  # how to get the rest
            assert html.count("L") < LARGE_PAYLOAD_CHARS / 2  # a part of it, not all
    env = {"DISPATCHER_DATABASE_URL": db_url}
    shown = await cli("jobs", "show", str(ids["readme"]), "--json", cwd=tmp_path, env=env)
    assert shown.code == 0, shown.stderr
    assert json.loads(shown.stdout)["target_url"] == URL
