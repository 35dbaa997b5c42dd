"""The shipped example `config/examples/session-cleanup.toml`, end to end on the embedded
database: its schedule fans out 16 ranges, the sql effect deletes expired sessions in bounded
pages, exactly the expired rows go, and the same period run again changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from dispatcher.config.settings import load_settings
from dispatcher.cron.service import CronService
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.sql import SqlEffect
from dispatcher.model import Job

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "examples" / "session-cleanup.toml"
OWNER = "cleanup-test"
ROWS = 10_000
EXPIRED = 6_000
# 03:15 in Berlin (CEST) on 2025-06-01: a period start of the example's "15 3 * * *"
PERIOD = datetime(2025, 6, 1, 1, 15, tzinfo=UTC)
FINGERPRINT = "SELECT md5(string_agg(id || '/' || user_id || '/' || expires_at, ',' ORDER BY id))"


async def seed_sessions(pool: asyncpg.Pool) -> None:
    """10,000 sessions; (i * 7919) mod 10,000 is a permutation, so exactly 6,000 of them expire
    before the period start and 4,000 after it (up to 67 minutes later)."""
    await pool.execute("""
        CREATE SCHEMA app;
        CREATE TABLE app.sessions (
            id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            user_id    bigint NOT NULL,
            expires_at timestamptz NOT NULL
        );
        CREATE INDEX sessions_expiry ON app.sessions (expires_at);
    """)
    await pool.execute(
        "INSERT INTO app.sessions (user_id, expires_at) "
        "SELECT i % 977, $1::timestamptz + make_interval(secs => (i * 7919) % $2 - $3) "
        "FROM generate_series(1, $2) AS i",
        PERIOD,
        ROWS,
        EXPIRED,
    )


async def run_units(repo: JobRepository, effect: SqlEffect, queue: str) -> list[Job]:
    """Play the worker pool: claim every ready unit and run the sql effect on it."""

    async def complete(conn: Any, job: Job, result: Any) -> bool:
        return await repo.complete_in(conn, job, result, OWNER)

    done: list[Job] = []
    while True:
        jobs, _ = await repo.claim(queue, 100, ["expire_sessions:1"], OWNER, 60)
        if not jobs:
            return done
        for job in jobs:
            async with repo.connection() as conn:
                await effect.run(job, complete, conn)
            done.append(job)


async def test_example_session_cleanup_deletes_exactly_the_expired_rows(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    settings = load_settings(EXAMPLE, environ={})
    (schedule,) = settings.schedules
    handler = settings.handlers[schedule.handler]
    # smaller pages than the example's 500, so every range takes several bounded pages
    handler = handler.model_copy(update={"page_size": 100})
    await repo.sync_registry(
        {name: (q.max_attempts, q.max_retry_age_s) for name, q in settings.queues.items()},
        {schedule.handler: ("sql", handler.version)},
    )
    await seed_sessions(pool)
    kept_before = await pool.fetchval(
        f"{FINGERPRINT} FROM app.sessions WHERE expires_at >= $1", PERIOD
    )
    assert (
        await pool.fetchval("SELECT count(*) FROM app.sessions WHERE expires_at < $1", PERIOD)
        == EXPIRED
    )

    cron = CronService(pool, repo, settings.schedules)
    receipt = await cron.trigger(schedule.name, PERIOD, via="cron")
    assert (receipt.outcome, receipt.unit_count) == ("created", 16)
    effect = SqlEffect(schedule.handler, handler, repo, OWNER)
    units = await run_units(repo, effect, schedule.queue)
    assert len(units) == 16

    rows = await pool.fetch(
        "SELECT key, state, result FROM dispatcher.jobs WHERE run_key = $1 ORDER BY key",
        receipt.run_key,
    )
    assert {r["state"] for r in rows} == {"succeeded"}
    deleted = [r["result"]["rows"] for r in rows]
    assert sum(deleted) == EXPIRED and all(n > 0 for n in deleted)  # every range had work
    assert all(r["result"]["pages"] == n // 100 + 1 for r, n in zip(rows, deleted, strict=True))
    assert await pool.fetchval("SELECT count(*) FROM app.sessions") == ROWS - EXPIRED
    assert (
        await pool.fetchval("SELECT count(*) FROM app.sessions WHERE expires_at < $1", PERIOD) == 0
    )
    assert await pool.fetchval(f"{FINGERPRINT} FROM app.sessions") == kept_before

    (view,) = await cron.status()
    assert view["last_run"]["units"] == {
        "total": 16,
        "succeeded": 16,
        "dead": 0,
        "cancelled": 0,
        "discarded": 0,
        "pending": 0,
    }
    assert view["last_run"]["finished_at"] is not None

    # The same period again (a second instance, a retried trigger, a catch-up): same run, no
    # new units, nothing to execute, nothing changed.
    table_before = await pool.fetchval(f"{FINGERPRINT} FROM app.sessions")
    jobs_before = await pool.fetchval(
        "SELECT md5(string_agg(key || state || coalesce(result::text, ''), ',' ORDER BY key)) "
        "FROM dispatcher.jobs"
    )
    again = await CronService(pool, repo, settings.schedules).trigger(schedule.name, PERIOD)
    caught = await cron.catch_up(schedule.name, PERIOD, PERIOD)
    assert again.outcome == "existing" and [r.outcome for r in caught] == ["existing"]
    assert await run_units(repo, effect, schedule.queue) == []
    # and even a redelivered unit's statement (same period, same range) finds nothing to delete
    for row in await pool.fetch(
        "SELECT payload FROM dispatcher.jobs WHERE run_key = $1", receipt.run_key
    ):
        unit = row["payload"]
        assert unit["period_start"] == "2025-06-01T01:15:00Z"
        status = await pool.execute(
            handler.statement or "", PERIOD, unit["range_start"], unit["range_end"], 100
        )
        assert status == "DELETE 0"
    assert await pool.fetchval(f"{FINGERPRINT} FROM app.sessions") == table_before
    assert (
        await pool.fetchval(
            "SELECT md5(string_agg(key || state || coalesce(result::text, ''), ',' ORDER BY key)) "
            "FROM dispatcher.jobs"
        )
        == jobs_before
    )
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.runs") == 1
