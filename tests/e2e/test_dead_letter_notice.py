"""Dead-letter notifications on a real daemon: a queue's `on_dead` target receives a signed
Standard Webhooks POST (verified with the `standardwebhooks` package) for each job that goes
dead, from a failed attempt and from a lease rescue on the last attempt; the notification is a
job of its own, written in the transaction that made the job dead; a notification that dies
never notifies again; a job redriven and dead again is reported again; a bad target URL stops
the configuration with one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from dispatcher.config.settings import Settings
from tests.harness import (
    Target,
    cli,
    make_settings,
    running_daemon,
    serve_target,
    until_job_states,
    wait_until,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


async def refuse(request: web.Request, count: int) -> web.StreamResponse:
    return web.Response(status=400, text="unknown grant")


def settings_for(db_url: str, notify_url: str, **queues: Any) -> Settings:
    return make_settings(
        db_url,
        http={"signing_secret": SECRET},
        queues={"default": {"on_dead": {"url": notify_url}}, **queues},
    )


async def notices(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT * FROM dispatcher.jobs WHERE dead_letter_of IS NOT NULL ORDER BY id"
    )
    return [dict(r) for r in rows]


async def test_a_job_that_dies_is_reported_by_a_signed_post_written_with_its_death(
    db_url: str,
) -> None:
    conn = await asyncpg.connect(db_url)
    async with (
        serve_target(Target(respond=refuse)) as broken,
        serve_target(Target()) as alerts,
        running_daemon(settings_for(db_url, alerts.url)) as d,
    ):
        job = await d.post_job(
            "grant-7",
            {
                "handler": "http",
                "target": {"url": broken.url},
                "tenant": "p-17",
                "payload": {"grant": 7},
            },
        )

        # whenever the death is visible, so is its notification (one transaction)
        async def dead_with_notice() -> bool:
            row = await conn.fetchrow(
                "SELECT j.state, EXISTS (SELECT 1 FROM dispatcher.jobs n"
                "  WHERE n.dead_letter_of = j.id) AS noticed"
                " FROM dispatcher.jobs j WHERE j.id = $1",
                job["id"],
            )
            assert row["state"] != "dead" or row["noticed"], "dead without its notice"
            return row["state"] == "dead"

        await wait_until(dead_with_notice, what="the job to die")
        await alerts.wait_for(lambda t: len(t.requests) == 1, what="the dead-letter POST")
        sent = alerts.requests[0]
        event = Webhook(SECRET).verify(sent["body"], sent["headers"])
        assert event["type"] == "job.dead"
        data = event["data"]
        assert data["id"] == job["id"]
        assert (data["key"], data["queue"], data["tenant"]) == ("grant-7", "default", "p-17")
        assert (data["reason"], data["attempt"], data["handler"]) == ("http_4xx", 1, "http")
        assert data["last_error"] == "HTTP 400: unknown grant"
        (notice,) = await notices(conn)
        assert sent["headers"]["webhook-id"] == sent["key"] == notice["key"]
        assert notice["key"].startswith(f"dead-letter:{job['id']}:")
        assert (notice["queue"], notice["handler"], notice["tenant"]) == (
            "default",
            "http",
            "p-17",
        )

        async def notice_succeeded() -> bool:
            return (await d.get_job(notice["id"]))["state"] == "succeeded"

        await wait_until(notice_succeeded, what="the notification job to succeed")
        view = await d.get_job(notice["id"])
        assert view["dead_letter_of"] == job["id"]

        # redriven and dead again: reported again, under a key of its own
        async with d.session.post(
            f"{d.base_url}/v1/jobs/redrive", json={"dead_reason": "http_4xx"}
        ) as r:
            assert (r.status, (await r.json())["count"]) == (200, 1)
        await alerts.wait_for(lambda t: len(t.requests) == 2, what="the second report")
        keys = {r["key"] for r in alerts.requests}
        assert len(keys) == 2
        assert len(await notices(conn)) == 2
    await conn.close()


async def test_a_lease_rescue_on_the_last_attempt_is_reported_even_with_the_queue_paused(
    db_url: str,
) -> None:
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target()) as alerts:
        settings = make_settings(
            db_url,
            http={"signing_secret": SECRET},
            queues={
                "default": {},
                "alerts": {},
                # a queue's notices may run in another queue, so a pause of its own holds
                # none of them back
                "mail": {"on_dead": {"url": alerts.url, "queue": "alerts"}},
            },
        )
        async with running_daemon(settings) as d:
            await conn.execute(
                "UPDATE dispatcher.queues SET paused = true, paused_at = now() WHERE name = 'mail'"
            )
            job = await d.post_job(
                "mail-1",
                {
                    "handler": "http",
                    "target": {"url": alerts.url},
                    "queue": "mail",
                    "max_attempts": 2,
                    "due_at": "2031-01-01T00:00:00Z",
                },
            )
            # a worker that took the last attempt and vanished
            await conn.execute(
                "UPDATE dispatcher.jobs SET state = 'running', attempt = 2, lease_owner = 'gone:1',"
                " lease_expires_at = now() - interval '1 second', started_at = now()"
                " WHERE id = $1",
                job["id"],
            )
            await alerts.wait_for(lambda t: len(t.requests) == 1, what="the dead-letter POST")
            event = Webhook(SECRET).verify(
                alerts.requests[0]["body"], alerts.requests[0]["headers"]
            )
            assert (event["data"]["id"], event["data"]["reason"]) == (job["id"], "lease_expired")
            assert event["data"]["queue"] == "mail"
            assert "lease of gone:1 expired during attempt 2" in event["data"]["last_error"]
            (notice,) = await notices(conn)
            assert notice["queue"] == "alerts"
    await conn.close()


async def test_a_notification_that_dies_never_notifies_again(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target(respond=refuse)) as everything_broken:
        settings = settings_for(db_url, everything_broken.url)
        async with running_daemon(settings) as d:
            job = await d.post_job(
                "grant-9", {"handler": "http", "target": {"url": everything_broken.url}}
            )

            await until_job_states(db_url, {"dead": 2})  # the job and its notification
            (notice,) = await notices(conn)
            assert notice["dead_letter_of"] == job["id"]
            assert notice["dead_reason"] == "http_4xx"
            # the notification's own death is a visible dead letter, and nothing reports it
            listed = await d.session.get(f"{d.base_url}/v1/jobs?state=dead")
            assert {j["id"] for j in (await listed.json())["items"]} == {job["id"], notice["id"]}
            assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 2
            assert [r["key"] for r in everything_broken.requests].count(notice["key"]) == 1
    await conn.close()


async def test_an_on_dead_url_is_checked_like_an_intake_target(tmp_path: Path) -> None:
    for url, message in (
        ("http://hooks.example.com/dead", "plain http is not allowed: use https"),
        ("https://10.1.2.3/dead", "address 10.1.2.3 is private-use"),
        ("https://169.254.169.254/latest", "is a cloud metadata endpoint"),
        ("ftp://hooks.example.com/dead", "scheme 'ftp' is not allowed"),
        ("https://user:pw@hooks.example.com/", "credentials in the URL are not allowed"),
    ):
        result = await cli(
            "check-config", cwd=tmp_path, env={"DISPATCHER_QUEUES__DEFAULT__ON_DEAD__URL": url}
        )
        assert result.code == 2, result.stdout
        (line,) = result.stderr.splitlines()
        assert line.startswith("dispatcher: configuration error: queues.default.on_dead.url: ")
        assert message in line
        assert line.endswith("(env DISPATCHER_QUEUES__DEFAULT__ON_DEAD__URL)")

    queue = await cli(
        "check-config",
        cwd=tmp_path,
        env={
            "DISPATCHER_QUEUES__DEFAULT__ON_DEAD__URL": "https://hooks.example.com/dead",
            "DISPATCHER_QUEUES__DEFAULT__ON_DEAD__QUEUE": "alerts",
        },
    )
    assert queue.code == 2
    assert "queues.default.on_dead.queue: 'alerts' is not in [queues]" in queue.stderr

    good = await cli(
        "check-config",
        cwd=tmp_path,
        env={"DISPATCHER_QUEUES__DEFAULT__ON_DEAD__URL": "https://hooks.example.com/dead"},
    )
    assert good.code == 0, good.stderr
    on_dead = json.loads(good.stdout)["queues"]["default"]["on_dead"]
    assert on_dead == {"url": "https://hooks.example.com/dead", "queue": None}
