"""Migration 015 splits each job into its intent and its state row. A database that an earlier
release left at migration 014 (its own function bodies, trigger and view: tests/db/releases/)
and that holds jobs in every state upgrades in place: every job reads the same through
`dispatcher.jobs` afterwards, the schema equals a fresh one, each unfinished job then runs
exactly once, and a job enqueued after the upgrade runs too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg

from dispatcher.db import schema
from dispatcher.db.snapshot import render
from tests.harness import Target, make_settings, running_daemon, serve_target, wait_until

UNFINISHED = ("due-later", "ready-now", "running-lease-lost", "cron-unit", "tenant-ready")
RUN = (*UNFINISHED, "after-upgrade")  # and one enqueued after the upgrade
RELEASE_014 = Path(__file__).with_name("releases") / "schema_v014.sql"


async def load_release_014(conn: asyncpg.Connection) -> None:
    """The schema as release 0.1.0 left it at migration 014, through its own pg_dump."""
    await conn.execute(RELEASE_014.read_text())
    await conn.execute("RESET ALL")  # the dump sets search_path and check_function_bodies


FINISHED = ("succeeded", "dead", "cancelled", "discarded")


async def populate(conn: asyncpg.Connection, url: str) -> None:
    """Jobs as migration 014's schema holds them, one per state (the engine's own statements
    wrote these shapes; here plain SQL does)."""
    target = json.dumps({"url": url})
    keys = list(UNFINISHED + FINISHED)
    await conn.execute(
        """SELECT dispatcher.enqueue_many($1::text[], array_fill('http'::text, ARRAY[$2::int]),
                   array_fill('{"n": 1}'::jsonb, ARRAY[$2::int]), NULL, NULL,
                   ARRAY(SELECT CASE WHEN k = 'tenant-ready' THEN 'property-7' END
                           FROM unnest($1::text[]) k),
                   array_fill($3::jsonb, ARRAY[$2::int]))""",
        keys,
        len(keys),
        target,
    )
    await conn.execute(
        """UPDATE dispatcher.jobs SET state = 'scheduled', due_at = now() + interval '2 seconds'
            WHERE key = 'due-later';
           DELETE FROM dispatcher.outbox
            WHERE job_id = (SELECT id FROM dispatcher.jobs WHERE key = 'due-later');
           UPDATE dispatcher.jobs SET run_key = 'nightly:2026-12-01', progress = '{"page": 3}'
            WHERE key = 'cron-unit';
           UPDATE dispatcher.jobs SET traceparent =
                  '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
            WHERE key = 'ready-now';
           -- a daemon that died mid-attempt: its lease has run out
           UPDATE dispatcher.jobs SET state = 'running', attempt = 1, lease_owner = 'gone:1',
                  lease_expires_at = now() - interval '1 second', started_at = now()
            WHERE key = 'running-lease-lost';
           DELETE FROM dispatcher.outbox
            WHERE job_id = (SELECT id FROM dispatcher.jobs WHERE key = 'running-lease-lost');
           UPDATE dispatcher.jobs SET state = k.state, attempt = 1, finished_at = now(),
                  started_at = now(), result = '{"ok": true}',
                  dead_reason = CASE WHEN k.state IN ('dead', 'discarded') THEN 'max_attempts' END,
                  last_error = CASE WHEN k.state IN ('dead', 'discarded') THEN 'HTTP 500' END
             FROM unnest($1::text[]) AS k(state)
            WHERE key = k.state;
           DELETE FROM dispatcher.outbox WHERE job_id IN (
                  SELECT id FROM dispatcher.jobs WHERE state <> 'ready');""".replace(
            "$1::text[]", "ARRAY['succeeded', 'dead', 'cancelled', 'discarded']"
        )
    )
    await conn.execute(
        """INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at,
                                            outcome, http_status)
           SELECT id, 1, 'old:1', now(), now(), 'succeeded', 200
             FROM dispatcher.jobs WHERE key = 'succeeded'"""
    )


# The view's columns as of migration 015; later migrations add their own after them (023:
# priority, concurrency_key), which this upgrade test does not compare.
COLUMNS_015 = 28


async def jobs_by_key(conn: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    rows = await conn.fetch("SELECT * FROM dispatcher.jobs ORDER BY id")
    return {r["key"]: dict(list(r.items())[:COLUMNS_015]) for r in rows}


async def test_a_populated_database_upgrades_in_place_and_every_job_runs_once(
    empty_db_url: str, db_url: str
) -> None:
    fresh = await asyncpg.connect(db_url)  # a fresh migrate of this release
    try:
        fresh_schema = await render(fresh)
    finally:
        await fresh.close()
    target = Target()
    async with serve_target(target):
        conn = await asyncpg.connect(empty_db_url)
        try:
            await load_release_014(conn)
            await populate(conn, target.url)  # through that release's own enqueue_many
            before = await jobs_by_key(conn)
            assert {j["state"] for j in before.values()} == {
                "scheduled",
                "ready",
                "running",
                "succeeded",
                "dead",
                "cancelled",
                "discarded",
            }

            applied = await schema.migrate(conn)
            assert applied[0] == "015_job_state.sql"

            assert await jobs_by_key(conn) == before  # every column of every job, unchanged
            assert await conn.fetchval("SELECT count(*) FROM dispatcher.intents") == len(before)
            assert await conn.fetchval("SELECT count(*) FROM dispatcher.job_state") == len(before)
            assert await render(conn) == fresh_schema  # functions, views, triggers included
            await conn.execute(
                "SELECT dispatcher.enqueue('after-upgrade', 'http', '{}', target => $1::jsonb)",
                json.dumps({"url": target.url}),
            )
        finally:
            await conn.close()

        settings = make_settings(empty_db_url, lease_s=2, scan_interval_s=0.1)
        async with running_daemon(settings):

            async def unfinished_done() -> bool:
                return all(key in target.request_keys() for key in RUN)

            await wait_until(unfinished_done, timeout_s=30, what="the unfinished jobs to run")
            conn = await asyncpg.connect(empty_db_url)
            try:
                await wait_until(
                    lambda: _all_succeeded(conn), timeout_s=10, what="completions recorded"
                )
                after = await jobs_by_key(conn)
            finally:
                await conn.close()

    ran = target.request_keys()
    assert sorted(ran) == sorted(RUN), ran  # each once; nothing finished ran again
    for key in FINISHED:
        assert after[key] == before[key]
    assert after["running-lease-lost"]["attempt"] == 2  # the lost attempt still counts
    assert after["cron-unit"]["run_key"] == "nightly:2026-12-01"


async def _all_succeeded(conn: asyncpg.Connection) -> bool:
    n = await conn.fetchval(
        "SELECT count(*) FROM dispatcher.jobs WHERE key = ANY ($1::text[]) AND state = 'succeeded'",
        list(RUN),
    )
    return bool(n == len(RUN))
