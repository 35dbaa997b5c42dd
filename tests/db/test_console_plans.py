"""Every query behind a console page reaches jobs and runs by index, and reads a bounded number
of rows, at any table size (the console must stay usable at 10 million jobs; the render time at
that size is measured by tests/bench/bench_console.py). Plans are checked on tables big enough
that a sequential scan would tempt the planner if an index did not serve."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from dispatcher.console.pages import DEAD_GROUPED, RECEIPTS_SHOWN
from dispatcher.db.queries import query
from tests.db.test_plans import assert_no_job_scan

ROWS = 40_000
RUNS = 3_000


@pytest.fixture(scope="module")
async def console_tables(module_pools: Callable[[], Awaitable[asyncpg.Pool]]) -> asyncpg.Pool:
    """Most jobs succeeded, some dead (three reasons) in two queues, a few ready; a schedule
    with thousands of runs, each with a unit. Built once: the module's tests only plan and
    read."""
    pool = await module_pools()
    await pool.execute(
        "INSERT INTO dispatcher.queues (name, max_attempts, max_retry_age_s) "
        "VALUES ('emails', 10, 86400)"
    )
    await pool.execute(f"""
        INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state, due_at,
                                     max_attempts, max_retry_age_s, budget_started_at,
                                     finished_at, dead_reason, run_key)
        SELECT 'k-' || g, md5(g::text), CASE WHEN g % 20 = 0 THEN 'default' ELSE 'emails' END,
               'http', '{{}}', s.state, now() - interval '1 day', 10, 86400, now(),
               CASE WHEN s.state <> 'ready' THEN now() - make_interval(secs => g) END,
               CASE WHEN s.state = 'dead' THEN (ARRAY['http_4xx', 'timeout', 'x'])[1 + g % 3] END,
               CASE WHEN g <= {RUNS} THEN 'hourly:' || g END
          FROM generate_series(1, {ROWS}) g
         CROSS JOIN LATERAL (SELECT CASE WHEN g % 10 = 0 THEN 'dead'
                                         WHEN g % 97 = 0 THEN 'ready'
                                         ELSE 'succeeded' END AS state) s""")
    await pool.execute(f"""
        INSERT INTO dispatcher.runs (run_key, schedule, period_start, via, unit_count,
                                     overlap_decision, released_at)
        SELECT 'hourly:' || g, 'hourly', now() - make_interval(hours => g), 'cron', 1, 'none', now()
          FROM generate_series(1, {RUNS}) g""")
    await pool.execute("""
        INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)
        SELECT id, queue, tenant, 'http:1' FROM dispatcher.jobs WHERE state = 'ready'""")
    await pool.execute(
        "ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.runs, dispatcher.queues,"
        " dispatcher.outbox"
    )
    return pool


async def plan(pool: asyncpg.Pool, statement: str, *args: object) -> str:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        rows = await conn.fetch("EXPLAIN " + statement, *args)
        return "\n".join(r[0] for r in rows)


async def test_dead_letter_groups_walk_each_queues_newest_by_index(
    console_tables: asyncpg.Pool,
) -> None:
    text = await plan(console_tables, query("dead_letter_groups"), DEAD_GROUPED)
    assert_no_job_scan(text)
    assert "jobs_terminal" in text and "Limit" in text, text  # bounded per queue
    rows = await console_tables.fetch(query("dead_letter_groups"), 1000)
    per_queue: dict[str, int] = {}
    for row in rows:
        per_queue[row["queue"]] = per_queue.get(row["queue"], 0) + row["n"]
    assert per_queue == {"default": 1000, "emails": 1000}  # capped: each has 2,000 dead
    assert {r["dead_reason"] for r in rows} == {"http_4xx", "timeout", "x"}


async def test_recent_receipts_read_a_few_runs_by_their_unique_index(
    console_tables: asyncpg.Pool,
) -> None:
    text = await plan(console_tables, query("recent_runs"), "hourly", RECEIPTS_SHOWN)
    assert "Seq Scan on runs" not in text, text
    assert_no_job_scan(text)
    assert "Limit" in text.splitlines()[0], text
    rows = await console_tables.fetch(query("recent_runs"), "hourly", RECEIPTS_SHOWN)
    assert [r["run_key"] for r in rows] == [f"hourly:{g}" for g in range(1, RECEIPTS_SHOWN + 1)]


async def test_retrying_units_of_the_last_runs_come_from_the_unfinished_units_index(
    console_tables: asyncpg.Pool,
) -> None:
    keys = [f"hourly:{g}" for g in range(90, 90 + RECEIPTS_SHOWN)]  # hourly:97 has a ready unit
    text = await plan(console_tables, query("runs_retrying"), keys)
    assert_no_job_scan(text)
    assert "jobs_run_unfinished" in text, text
    async with console_tables.acquire() as conn:
        assert await conn.fetch(query("runs_retrying"), keys) == []  # ready, never failed
        change = conn.transaction()  # rolled back: the module's tables stay as built
        await change.start()
        try:
            await conn.execute(
                "UPDATE dispatcher.job_state SET last_error = 'HTTP 503'"
                " WHERE run_key = 'hourly:97'"
            )
            rows = await conn.fetch(query("runs_retrying"), keys)
        finally:
            await change.rollback()
    assert [(r["run_key"], r["retrying"]) for r in rows] == [("hourly:97", 1)]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("get_job", (123,)),
        ("list_attempts", (123, None, 50)),
        ("count_overdue", (300.0,)),
        ("list_queues", ()),
    ],
)
async def test_the_job_page_and_overview_reads_never_scan_jobs(
    console_tables: asyncpg.Pool, name: str, args: tuple[object, ...]
) -> None:
    text = await plan(console_tables, query(name), *args)
    assert_no_job_scan(text)


@pytest.mark.parametrize("name", ["ready_priority_mix", "ready_top_tenants"])
async def test_the_queue_pages_ready_counts_walk_the_ready_claim_index_bounded(
    console_tables: asyncpg.Pool, name: str
) -> None:
    args = (100_000, 10) if name == "ready_top_tenants" else (100_000,)
    text = await plan(console_tables, query(name), "emails", *args)
    assert_no_job_scan(text)
    assert "jobs_ready_claim" in text and "Limit" in text, text
    rows = await console_tables.fetch(query(name), "emails", *args)
    ready = await console_tables.fetchval(
        "SELECT count(*) FROM dispatcher.job_state WHERE queue = 'emails' AND state = 'ready'"
    )
    assert sum(r["jobs"] for r in rows) == ready
