"""Retention deletes exactly the expired terminal rows, never live work or young dead letters."""

from __future__ import annotations

import asyncpg

from dispatcher.config.settings import RetentionSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.engine.pruning import Pruner


async def seed(
    conn: asyncpg.Connection, state: str, n: int, finished_days_ago: float | None, prefix: str
) -> None:
    await conn.execute(
        """INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state, due_at,
               max_attempts, max_retry_age_s, budget_started_at, finished_at, lease_owner)
           SELECT $1 || g, 'h', 'default', 'http', '{}', $2, now(), 3, 60, now(),
                  now() - make_interval(days => $3::int), CASE WHEN $2 = 'running' THEN 'x' END
             FROM generate_series(1, $4) g""",
        prefix,
        state,
        finished_days_ago,
        n,
    )


async def test_pruning_deletes_exactly_the_expired_terminal_rows(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await seed(conn, "succeeded", 2500, 8, "old-ok-")
        await seed(conn, "succeeded", 30, 6, "young-ok-")
        await seed(conn, "dead", 40, 31, "old-dead-")
        await seed(conn, "dead", 50, 29, "young-dead-")
        await seed(conn, "cancelled", 5, 8, "old-cancel-")
        # discarded dead letters are kept for the dead retention, from the time they died
        await seed(conn, "discarded", 12, 31, "old-discarded-")
        await seed(conn, "discarded", 9, 29, "young-discarded-")
        await seed(conn, "scheduled", 60, None, "waiting-")
        await seed(conn, "running", 7, None, "running-")
        # bulk actions' records: finished long ago, finished lately, unfinished long ago
        await conn.execute(
            """INSERT INTO dispatcher.bulk_actions (key, action, request_hash, actor, fence_id,
                   created_at, finished_at)
               VALUES ('old', 'retry', 'h', 'ops', 1, now() - interval '40 days',
                       now() - interval '31 days'),
                      ('young', 'retry', 'h', 'ops', 1, now(), now()),
                      ('cut-off', 'retry', 'h', 'ops', 1, now() - interval '40 days', NULL)"""
        )
    pruner = Pruner(JobRepository(pool), RetentionSettings(batch=1000))
    assert await pruner.run_once() == {
        "succeeded": 2500,
        "cancelled": 5,
        "dead": 40,
        "discarded": 12,
        "runs": 0,
        "keys": 0,
        "bulk_actions": 1,
        "history": 0,
    }
    assert {r["key"] for r in await pool.fetch("SELECT key FROM dispatcher.bulk_actions")} == {
        "young",
        "cut-off",
    }
    async with pool.acquire() as conn:
        left = await conn.fetch(
            r"SELECT regexp_replace(key, '\d+$', '') AS kind, count(*) AS n"
            " FROM dispatcher.jobs GROUP BY 1"
        )
    assert {r["kind"]: r["n"] for r in left} == {
        "young-ok-": 30,
        "young-dead-": 50,
        "young-discarded-": 9,
        "waiting-": 60,
        "running-": 7,
    }
    assert await pruner.run_once() == {
        "succeeded": 0,
        "cancelled": 0,
        "dead": 0,
        "discarded": 0,
        "runs": 0,
        "keys": 0,
        "bulk_actions": 0,
        "history": 0,
    }


async def test_run_receipts_go_only_after_their_units(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        for key, days, with_unit in (
            ("old-bare", 100, False),
            ("old-with-unit", 100, True),
            ("young-bare", 10, False),
        ):
            await conn.execute(
                """INSERT INTO dispatcher.runs (run_key, schedule, period_start, via, unit_count,
                       overlap_decision, released_at, finished_at)
                   VALUES ($1, $1, now() - make_interval(days => $2), 'cron', 0, 'none',
                           now(), now() - make_interval(days => $2))""",
                key,
                days,
            )
            if with_unit:
                await seed(conn, "scheduled", 1, None, f"{key}-unit-")
                await conn.execute("UPDATE dispatcher.jobs SET run_key = $1", key)
    pruned = await Pruner(JobRepository(pool), RetentionSettings()).run_once()
    assert pruned["runs"] == 1
    async with pool.acquire() as conn:
        left = {r["run_key"] for r in await conn.fetch("SELECT run_key FROM dispatcher.runs")}
    assert left == {"old-with-unit", "young-bare"}


async def test_state_estimates_for_huge_tables_follow_planner_statistics(
    pool: asyncpg.Pool,
) -> None:
    async with pool.acquire() as conn:
        await seed(conn, "succeeded", 300, 1, "done-")
        await seed(conn, "scheduled", 100, None, "later-")
        await conn.execute("ANALYZE dispatcher.intents, dispatcher.job_state")
    repo = JobRepository(pool)
    assert await repo.estimated_jobs() == 400
    estimate = {(q, s): n for q, s, n in await repo.estimate_by_state(4_000_000)}
    assert estimate == {("default", "succeeded"): 3_000_000, ("default", "scheduled"): 1_000_000}
