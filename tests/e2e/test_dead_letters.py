"""Dead letters on a real daemon, through the API and the CLI: discard one (terminal `discarded`,
still listed), bulk redrive and bulk discard by filter in bounded batches, idempotent when
repeated, a dry run that changes nothing; cancel refuses a dead job and points at discard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import web

from dispatcher.config.settings import Settings
from tests.harness import (
    InProcessDaemon,
    Target,
    cli,
    make_settings,
    running_daemon,
    serve_target,
    until_job_count,
    until_job_states,
)

SEEDED = 2_500


def settings_for(db_url: str) -> Settings:
    return make_settings(
        db_url,
        queues={"default": {}, "mail": {"backoff_base_s": 0.01, "backoff_cap_s": 0.02}},
    )


def cli_env(settings: Settings) -> dict[str, str]:
    assert settings.database_url is not None
    return {"DISPATCHER_DATABASE_URL": settings.database_url.get_secret_value()}


async def post(d: InProcessDaemon, path: str, body: Any = None) -> tuple[int, Any]:
    async with d.session.post(f"{d.base_url}{path}", json=body) as r:
        return r.status, await r.json(content_type=None)


async def get(d: InProcessDaemon, path: str) -> Any:
    async with d.session.get(f"{d.base_url}{path}") as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def seed_dead(conn: asyncpg.Connection, url: str) -> None:
    """Dead letters as the executor leaves them, spread over queues, reasons, tenants and the
    time they died (job i died i minutes before 2026-01-01 + 10 days)."""
    await conn.execute(
        """INSERT INTO dispatcher.jobs (key, request_hash, queue, tenant, handler, target,
                   payload, state, due_at, attempt, max_attempts, max_retry_age_s,
                   budget_started_at, dead_reason, last_error, started_at, finished_at)
           SELECT 'dead-' || g, 'h', CASE WHEN g % 5 = 0 THEN 'mail' ELSE 'default' END,
                  CASE WHEN g % 2 = 0 THEN 'tenant-a' ELSE 'tenant-b' END, 'http',
                  jsonb_build_object('url', $1::text, 'method', 'POST', 'headers', '{}'::jsonb,
                                     'timeout_s', 5),
                  '{}', 'dead', now() - interval '30 days', 3, 3, 86400,
                  now() - interval '30 days',
                  CASE WHEN g % 3 = 0 THEN 'http_4xx' ELSE 'max_attempts' END, 'HTTP 503',
                  now() - interval '20 days',
                  timestamptz '2026-01-11T00:00:00Z' - make_interval(mins => g)
             FROM generate_series(1, $2::int) g""",
        url,
        SEEDED,
    )


async def by_state(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("SELECT state, count(*)::int AS n FROM dispatcher.jobs GROUP BY 1")
    return {r["state"]: r["n"] for r in rows}


async def test_bulk_redrive_is_bounded_idempotent_and_a_dry_run_changes_nothing(
    db_url: str,
) -> None:
    settings = settings_for(db_url)
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target()) as target, running_daemon(settings) as d:
        await seed_dead(conn, target.url)
        snapshot = await conn.fetch("SELECT * FROM dispatcher.jobs ORDER BY id")

        status, dry = await post(d, "/v1/jobs/redrive", {"all": True, "dry_run": True})
        assert (status, dry) == (
            200,
            {"action": "redrive", "dry_run": True, "count": SEEDED, "batches": 0},
        )
        filtered = {
            "queue": "default",
            "dead_reason": "http_4xx",
            "tenant": "tenant-a",
            "dry_run": True,
        }
        status, dry = await post(d, "/v1/jobs/redrive", filtered)
        expected = sum(1 for g in range(1, SEEDED + 1) if g % 5 and g % 3 == 0 and g % 2 == 0)
        assert (status, dry["count"]) == (200, expected)
        status, dry = await post(d, "/v1/jobs/redrive", {"all": True, "limit": 7, "dry_run": True})
        assert dry["count"] == 7
        # died in [2026-01-10T00:00Z, 2026-01-10T10:00Z): jobs 841 to 1440
        window = {
            "dead_since": "2026-01-10T00:00:00Z",
            "dead_before": "2026-01-10T10:00:00Z",
            "dry_run": True,
        }
        assert (await post(d, "/v1/jobs/discard", window))[1]["count"] == 600
        assert await conn.fetch("SELECT * FROM dispatcher.jobs ORDER BY id") == snapshot
        assert await conn.fetchval("SELECT count(*) FROM dispatcher.outbox") == 0

        # bounded: 1,200 of them, in batches of at most 1,000 statements' worth
        status, moved = await post(d, "/v1/jobs/redrive", {"queue": "default", "limit": 1200})
        assert (status, moved) == (
            200,
            {"action": "redrive", "dry_run": False, "count": 1200, "batches": 2},
        )
        status, moved = await post(d, "/v1/jobs/redrive", {"queue": "default"})
        assert (moved["count"], moved["batches"]) == (SEEDED * 4 // 5 - 1200, 1)
        status, again = await post(d, "/v1/jobs/redrive", {"queue": "default"})
        assert (status, again["count"]) == (200, 0)  # repeating it moves nothing

        expected = {"succeeded": SEEDED * 4 // 5, "dead": SEEDED // 5}
        await until_job_states(db_url, expected, timeout_s=60)  # every redriven job ran
        assert len(target.requests) == SEEDED * 4 // 5  # each once
        # a fresh attempt budget, like a retry: the one attempt it took is number 1
        fresh = await conn.fetchrow(
            "SELECT attempt, dead_reason, budget_started_at > now() - interval '1 hour' AS reset"
            " FROM dispatcher.jobs WHERE key = 'dead-1'"
        )
        assert (fresh["attempt"], fresh["dead_reason"], fresh["reset"]) == (1, None, True)
    await conn.close()


async def test_a_redriven_job_that_dies_again_is_not_taken_twice_by_the_same_call(
    db_url: str,
) -> None:
    async def refuse(request: web.Request, count: int) -> web.StreamResponse:
        return web.Response(status=400, text="still broken")

    settings = settings_for(db_url)
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target(respond=refuse)) as target, running_daemon(settings) as d:
        await seed_dead(conn, target.url)
        status, moved = await post(d, "/v1/jobs/redrive", {"all": True})
        # the daemon kills them again while the call walks; the call ends, each taken once
        assert (status, moved["count"]) == (200, SEEDED)

        await until_job_states(db_url, {"dead": SEEDED}, timeout_s=60)  # dead again
        reasons = await conn.fetch("SELECT DISTINCT dead_reason FROM dispatcher.jobs")
        assert [r["dead_reason"] for r in reasons] == ["http_4xx"]
    await conn.close()


async def test_discard_one_and_in_bulk_through_the_api_and_the_cli(
    db_url: str, tmp_path: Path
) -> None:
    async def refuse(request: web.Request, count: int) -> web.StreamResponse:
        return web.Response(status=422, text="no such grant")

    settings = settings_for(db_url)
    env = cli_env(settings)
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target(respond=refuse)) as target, running_daemon(settings) as d:
        ids = []
        for i in range(6):
            job = await d.post_job(
                f"grant-{i}", {"handler": "http", "target": {"url": target.url}, "tenant": "t1"}
            )
            ids.append(job["id"])
        waiting = await d.post_job(
            "later",
            {"handler": "http", "target": {"url": target.url}, "due_at": "2031-01-01T00:00:00Z"},
        )

        await until_job_count(db_url, "dead", 6)

        status, view = await post(d, f"/v1/jobs/{ids[0]}/discard")
        assert (status, view["state"], view["dead_reason"]) == (200, "discarded", "http_4xx")
        assert view["finished_at"] is not None  # when it died: the dead retention counts from it
        status, doc = await post(d, f"/v1/jobs/{ids[0]}/discard")
        assert (status, doc["state"]) == (409, "discarded")
        assert doc["detail"] == f"job {ids[0]} is discarded; only dead jobs can be discarded"
        status, doc = await post(d, f"/v1/jobs/{waiting['id']}/discard")
        assert (status, doc["detail"]) == (
            409,
            f"job {waiting['id']} is scheduled; only dead jobs can be discarded",
        )
        assert (await post(d, "/v1/jobs/424242/discard"))[0] == 404
        listed = await get(d, "/v1/jobs?state=discarded")
        assert [j["id"] for j in listed["items"]] == [ids[0]]

        # cancel does not reach a dead job: discard is the verdict for it
        status, doc = await post(d, f"/v1/jobs/{ids[1]}/cancel")
        assert status == 409
        assert doc["detail"] == (
            f"job {ids[1]} is already dead; nothing to cancel; to set a dead letter aside, "
            "discard it"
        )

        one = await cli("jobs", "discard", str(ids[1]), "--json", cwd=tmp_path, env=env)
        assert one.code == 0, one.stderr
        assert '"state": "discarded"' in one.stdout
        twice = await cli("jobs", "discard", str(ids[1]), cwd=tmp_path, env=env)
        assert twice.code == 1
        assert f"job {ids[1]} is discarded; only dead jobs can be discarded" in twice.stderr

        dry = await cli(
            "jobs", "discard", "--reason", "http_4xx", "--dry-run", cwd=tmp_path, env=env
        )
        assert (dry.code, dry.stdout.strip()) == (
            0,
            "discard: would move 4 dead job(s) to discarded",
        )
        assert (await by_state(conn))["dead"] == 4
        bulk = await cli(
            "jobs", "discard", "--reason", "http_4xx", "--tenant", "t1", cwd=tmp_path, env=env
        )
        assert (bulk.code, bulk.stdout.strip()) == (0, "discard: moved 4 dead job(s) to discarded")
        again = await cli("jobs", "discard", "--reason", "http_4xx", cwd=tmp_path, env=env)
        assert again.stdout.strip() == "discard: moved 0 dead job(s) to discarded"
        assert await by_state(conn) == {"discarded": 6, "scheduled": 1}

        # a discarded job can still be retried, with a fresh budget
        status, view = await post(d, f"/v1/jobs/{ids[2]}/retry")
        assert (status, view["state"], view["attempt"]) == (200, "ready", 0)
        listed = await cli("jobs", "list", "--state", "discarded", "--json", cwd=tmp_path, env=env)
        assert listed.code == 0, listed.stderr
        assert str(ids[2]) not in {
            line.split(":")[-1].strip(" ,") for line in listed.stdout.splitlines() if '"id"' in line
        }
    await conn.close()


async def test_bulk_requests_are_checked_before_anything_moves(db_url: str, tmp_path: Path) -> None:
    settings = settings_for(db_url)
    env = cli_env(settings)
    async with running_daemon(settings) as d:
        for body, status, detail in (
            (
                {},
                422,
                "name at least one filter (queue, dead_reason, tenant, dead_since, "
                'dead_before), or send "all": true',
            ),
            ({"queue": "nope"}, 422, "queue: unknown queue 'nope'; queues: default, mail"),
            ({"all": True, "limit": 0}, 422, "limit: Input should be greater than or equal to 1"),
            ({"all": "yes"}, 422, "all: Input should be a valid boolean"),
            ({"all": True, "dry_run": 1}, 422, "dry_run: Input should be a valid boolean"),
            ({"all": True, "state": "dead"}, 422, "state: Extra inputs are not permitted"),
            ({"dead_since": "2026-01-02"}, 422, "dead_since: must be an RFC 3339 timestamp"),
            (
                {"dead_since": "2026-01-02T00:00:00Z", "dead_before": "2026-01-01T00:00:00Z"},
                422,
                "dead_since must be earlier than dead_before",
            ),
            ([1], 422, "body must be a JSON object"),
        ):
            for path in ("/v1/jobs/redrive", "/v1/jobs/discard"):
                got, doc = await post(d, path, body)
                assert (got, detail in doc["detail"]) == (status, True), (body, doc)

    for args, message in (
        (("redrive",), "name at least one filter"),
        (("redrive", "--queue", "nope"), "dispatcher: --queue: unknown queue 'nope'"),
        (("discard", "--since", "yesterday"), "dispatcher: --since: must be an RFC 3339"),
        (("discard", "3", "--reason", "x"), "dispatcher: give a job ID or filters, not both"),
        (("redrive", "--limit", "0", "--all"), "--limit: '0': expected an integer from 1"),
    ):
        result = await cli("jobs", *args, cwd=tmp_path, env=env)
        assert result.code == 2, (args, result.stdout)
        assert message in result.stderr, (args, result.stderr)
