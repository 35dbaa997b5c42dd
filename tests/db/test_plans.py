"""The engine's batch statements reach jobs by index at any table size.

With tens of thousands of rows the planner would rather hash a sequential scan of the whole jobs
table than probe the primary key 1,000 times; every claim and scan then costs time in proportion
to the table, not to the batch. These plans are checked on a table big enough to tempt it.
"""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db.queries import query

ROWS = 30_000


@pytest.fixture
async def big_table(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    for state, due in (("ready", "now()"), ("scheduled", "now() - interval '1 second'")):
        await pool.execute(f"""
            SELECT count(*) FROM dispatcher.enqueue_many(
                   (SELECT array_agg('{state}-' || g) FROM generate_series(1, {ROWS // 2}) g),
                   array_fill('noop'::text, ARRAY[{ROWS // 2}]),
                   array_fill('{{}}'::jsonb, ARRAY[{ROWS // 2}]),
                   array_fill({due}, ARRAY[{ROWS // 2}]))""")
    await pool.execute("""
        UPDATE dispatcher.jobs SET state = 'scheduled'
         WHERE key LIKE 'scheduled-%';
        DELETE FROM dispatcher.outbox o USING dispatcher.jobs j
         WHERE o.job_id = j.id AND j.state = 'scheduled'""")
    await pool.execute("ANALYZE dispatcher.jobs, dispatcher.outbox")
    return pool


async def plan(pool: asyncpg.Pool, statement: str, *args: object) -> str:
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch("EXPLAIN " + statement, *args)
        return "\n".join(r[0] for r in rows)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("claim_ready", ("default", 1000, ["noop:1"], "owner", 60.0)),
        ("scan_due", (2000,)),
        ("rescue_expired_leases", (1000,)),
        ("prune_terminal", ("succeeded", 86400.0, 1000)),
    ],
)
async def test_batch_statements_never_scan_the_whole_jobs_table(
    big_table: asyncpg.Pool, name: str, args: tuple[object, ...]
) -> None:
    text = await plan(big_table, query(name), *args)
    assert "Seq Scan on jobs" not in text, text
    assert "Seq Scan on outbox" not in text, text


# the attempt history ----------------------------------------------------------------------------
@pytest.fixture
async def with_history(big_table: asyncpg.Pool) -> asyncpg.Pool:
    """Three attempts for every job of big_table, half of them finished long ago."""
    await big_table.execute("""
        UPDATE dispatcher.jobs SET state = 'succeeded', finished_at = now() - interval '30 days'
         WHERE id % 2 = 0 AND state = 'scheduled';
        INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at, outcome)
        SELECT j.id, n, 'w:1', now(), now(), 'retried'
          FROM dispatcher.jobs j, generate_series(1, 3) n""")
    await big_table.execute("ANALYZE dispatcher.jobs, dispatcher.attempts")
    return big_table


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("list_attempts", (4242, None, 100)),
        ("list_attempts", (4242, 9000, 100)),
        ("prune_terminal", ("succeeded", 86400.0, 1000)),
    ],
)
async def test_the_attempt_history_is_read_and_pruned_by_index(
    with_history: asyncpg.Pool, name: str, args: tuple[object, ...]
) -> None:
    text = await plan(with_history, query(name), *args)
    assert "Seq Scan on attempts" not in text, text
    assert "Seq Scan on jobs" not in text, text
    assert "attempts_pkey" in text, text
