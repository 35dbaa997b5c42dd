"""The job list's searches (migration 039) reach their indexes on a table big enough that a
walk of the primary key would tempt the planner if an index did not serve: a key prefix
(jobs_key_prefix_id, migration 042), text in the last error (jobs_last_error_trgm, pg_trgm),
a concurrency key (intents_concurrency_key_id, migration 048), alone and beside the other
filters. The statements are planned as the pools plan them (with their values) from the
parameters the repository builds (`job_reads.list_args`). The time at 10 million jobs is
measured by tests/bench/bench_console.py.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from dispatcher.db import job_reads
from dispatcher.db.queries import query
from dispatcher.model import JobFilter, ListCursor
from tests.db.test_plans import assert_no_job_scan, plan

ROWS = 60_000
NewPool = Callable[[], Awaitable[asyncpg.Pool]]


@pytest.fixture(scope="module")
async def searched_table(module_pools: NewPool) -> asyncpg.Pool:
    """Keys `order-<n>` (a prefix such as order-4711 is a sliver of the table), every 10th job
    dead with an error naming its order, concurrency keys of 2,000 customers, and a result of
    300 bytes on each (state rows of a realistic width: with narrow rows, 60,000 of them are
    few enough pages that reading them all is cheaper than the trigram index's fixed cost)."""
    pool = await module_pools()
    await pool.execute(f"""
        INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state, due_at,
               max_attempts, max_retry_age_s, budget_started_at, finished_at, dead_reason,
               last_error, concurrency_key, result)
        SELECT 'order-' || g, md5(g::text), 'default', 'noop', '{{}}'::jsonb,
               CASE WHEN g % 10 = 0 THEN 'dead' ELSE 'succeeded' END, now(), 10, 86400, now(),
               now(), CASE WHEN g % 10 = 0 THEN 'http_5xx' END,
               CASE WHEN g % 10 = 0 THEN 'HTTP 503 from billing (order ' || g || ')' END,
               'customer-' || (g % 2000), jsonb_build_object('text', repeat('x', 300))
          FROM generate_series(1, {ROWS}) g""")
    await pool.execute("ANALYZE dispatcher.intents, dispatcher.job_state")
    return pool


def args_for(statement: str, cursor: ListCursor | None = None, **filters: object) -> tuple:  # type: ignore[type-arg]
    return job_reads.list_args(statement, JobFilter(**filters), cursor, 100)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"key_prefix": "order-4711"}, "jobs_key_prefix_id"),
        ({"key_prefix": "order-4711", "state": "dead"}, "jobs_key_prefix_id"),
        ({"error": "order 47110)"}, "jobs_last_error_trgm"),
        ({"error": "ORDER 4711", "queue": "default"}, "jobs_last_error_trgm"),
        ({"concurrency_key": "customer-42"}, "intents_concurrency_key_id"),
        ({"concurrency_key": "customer-42", "state": "dead"}, "intents_concurrency_key_id"),
    ],
    ids=lambda v: "+".join(v) if isinstance(v, dict) else v,
)
async def test_each_search_reaches_its_index(
    searched_table: asyncpg.Pool, filters: dict[str, object], index: str
) -> None:
    assert await searched_table.fetchval(query("error_search_indexed")) is True
    for statement, cursor in (("list_jobs", None), ("list_jobs", ListCursor(30_000))):
        text = await plan(searched_table, query(statement), *args_for(statement, cursor, **filters))
        assert_no_job_scan(text)
        assert index in text, text


async def test_a_common_error_text_walks_the_newest_jobs_and_stops_at_a_page(
    searched_table: asyncpg.Pool,
) -> None:
    """Text in every tenth error fills a page from the newest jobs at once: a bounded backward
    walk of the primary key (the LIMIT stops it), which the planner prefers to the index."""
    text = await plan(searched_table, query("list_jobs"), *args_for("list_jobs", error="billing"))
    assert_no_job_scan(text)
    assert text.splitlines()[0].startswith("Limit"), text


async def test_a_due_window_with_a_search_still_walks_the_window(
    searched_table: asyncpg.Pool,
) -> None:
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    window = {"due_after": now - timedelta(days=1), "due_before": now + timedelta(days=1)}
    args = args_for("list_jobs_by_due", key_prefix="order-4711", **window)
    text = await plan(searched_table, query("list_jobs_by_due"), *args)
    assert_no_job_scan(text)


async def test_without_the_trigram_index_the_error_search_reads_only_the_newest_jobs(
    searched_table: asyncpg.Pool,
) -> None:
    """Where pg_trgm could not be created: the search looks at ERROR_SCAN_ROWS newest jobs, a
    range of the primary key, never the whole table. Here with a bound of 100 jobs of 60,000,
    a smaller share than 100,000 of 10 million is: the planner weighs the range's probes
    against a read of the whole table, and 60,000 narrow rows make that read cheap."""
    async with searched_table.acquire() as conn:
        change = conn.transaction()  # rolled back: the module's table keeps its index
        await change.start()
        try:
            await conn.execute("DROP INDEX dispatcher.jobs_last_error_trgm")
            f = JobFilter(error="order")
            floor = await job_reads.error_scan_floor(conn, f)
            assert floor == ROWS - job_reads.ERROR_SCAN_ROWS  # all 60,000 here
            args = job_reads.list_args("list_jobs", f, None, 100, error_floor=ROWS - 100)
            text = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + query("list_jobs"), *args))
            rows = await conn.fetch(query("list_jobs"), *args)
        finally:
            await change.rollback()
    assert_no_job_scan(text)
    assert "job_state_pkey" in text or "jobs_pkey" in text, text
    assert [r["id"] for r in rows] == list(range(ROWS, ROWS - 100, -10))  # every 10th


async def ran(pool: asyncpg.Pool, args: tuple) -> tuple[str, list[int]]:  # type: ignore[type-arg]
    """list_jobs run with `args`: the plan as it ran (EXPLAIN ANALYZE: which branch read rows,
    which never ran; no timing looked at) and the ids of its page."""
    async with pool.acquire() as conn, conn.transaction():
        # BUFFERS off: PostgreSQL 18 adds buffer lines under every node with ANALYZE, between
        # a gate and the node it guards
        explain = "EXPLAIN (ANALYZE, TIMING off, BUFFERS off) "
        rows = await conn.fetch(explain + query("list_jobs"), *args)
        page = await conn.fetch(query("list_jobs"), *args)
    return "\n".join(r[0] for r in rows), [r["id"] for r in page]


def branch_ran(text: str, name: str) -> bool:
    """Whether list_jobs's branch `name` (`matched` or `walked`) ran in a plan as run: each is
    gated by a one-time filter on whether the prefix's ids were all read (`matched` when they
    were, `walked`, NOT, when they were not), and the node under a gate that failed is never
    executed. With a slice both are planned away."""
    lines = text.splitlines()
    # `sliced` and the branches a slice excludes are planned away ("false") by the values
    gates = [
        n
        for n, line in enumerate(lines)
        if "One-Time Filter:" in line and "One-Time Filter: false" not in line
    ]
    if not gates:
        return False
    walked = [n for n in gates if "One-Time Filter: (NOT " in lines[n]]
    (gate,) = walked if name == "walked" else [n for n in gates if n not in walked]
    return "never executed" not in lines[gate + 1]


def expected_ids(prefix: str, below: int | None = None) -> list[int]:
    """The ids of keys `order-<n>` (n = id) starting with `prefix`, newest first."""
    return [
        n
        for n in range(ROWS, 0, -1)
        if f"order-{n}".startswith(prefix) and (below is None or n < below)
    ]


async def test_a_prefix_of_many_old_keys_reads_its_ids_from_the_index_not_the_primary_key(
    searched_table: asyncpg.Pool,
) -> None:
    """order-1 matches 11,111 keys, nearly all among the oldest third of the ids (10,000 to
    19,999): the ids come from jobs_key_prefix_id (carrying the id), sorted, and the
    page's jobs are read by id; the walk of the primary key never runs. Before migration 042
    the planner walked the primary key backwards from the newest job, expecting the matches
    spread over all ids (15.2 s p95 at 10 million jobs)."""
    for cursor in (None, ListCursor(40_000)):
        text, ids = await ran(searched_table, args_for("list_jobs", cursor, key_prefix="order-1"))
        assert_no_job_scan(text)
        # a bitmap scan ("... on <index>"), or index-only ("using <index> on ...") once vacuum
        # marks the pages; in a database whose collation is C (the embedded server's) the key's
        # own unique index serves the range as well
        assert re.search(r"\b(?:on|using) jobs_key_(?:prefix_id|key)\b", text), text
        assert branch_ran(text, "matched") and not branch_ran(text, "walked"), text
        assert ids == expected_ids("order-1", cursor.id if cursor else None)[:100]


async def test_a_prefix_with_more_matches_than_the_cap_walks_the_primary_key_to_the_same_page(
    searched_table: asyncpg.Pool,
) -> None:
    """With more matching ids than PREFIX_SCAN_IDS (here a cap of 1,000 for 11,111 matches),
    the statement walks the primary key instead, and finds the same pages; a prefix under the
    cap is served by the sorted ids even when the cursor leaves only a few below it."""
    for cursor in (None, ListCursor(19_500), ListCursor(1_100)):
        args = args_for("list_jobs", cursor, key_prefix="order-1")
        capped = (*args[:-2], 1_000, None)  # no slice: as a bulk action reads
        below = cursor.id if cursor else None
        text, ids = await ran(searched_table, capped)
        assert ids == expected_ids("order-1", below)[:100]
        matches_below = len(expected_ids("order-1", below))
        walked = matches_below >= 1_000
        assert branch_ran(text, "walked") == walked, text
        assert branch_ran(text, "matched") != walked, text


def walked_ids(text: str) -> list[int]:
    """The rows each backward walk of the intents' primary key (jobs_pkey) returned in a plan
    as run (EXPLAIN ANALYZE)."""
    walks = [line for line in text.splitlines() if "Backward using jobs_pkey on intents" in line]
    return [int(line.split("actual rows=")[1].split()[0].split(".")[0]) for line in walks]


@pytest.mark.parametrize(
    ("cursor", "expected"),
    [
        (None, []),  # the newest 2,000 ids hold no order-1...: an empty page, bounded
        (ListCursor(20_500), list(range(19_999, 19_899, -1))),  # a full page, found at once
        (ListCursor(10_050), list(range(10_049, 9_999, -1))),  # 50 in the slice: all of them
    ],
    ids=["newest", "full", "short"],
)
async def test_a_prefix_with_many_matches_walks_a_bounded_slice_of_the_primary_key(
    searched_table: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
    cursor: ListCursor | None,
    expected: list[int],
) -> None:
    """order-1 matches 11,111 keys, nearly all old. With more matches than PREFIX_SCAN_IDS
    (here 1,000) below the cursor, a page walks the intents' primary key down from the
    cursor over PREFIX_SLICE_IDS ids at most (here 2,000), checks each key there, and reads
    only the matches' jobs; jobs_key_prefix_id is not read for the page (the walk's LIMIT
    keeps the planner from reading every match from it and sorting them, the unbounded read
    the slice avoids), and neither `matched` nor the unbounded `walked` runs."""
    monkeypatch.setattr(job_reads, "PREFIX_SCAN_IDS", 1_000)
    monkeypatch.setattr(job_reads, "PREFIX_SLICE_IDS", 2_000)
    f = JobFilter(key_prefix="order-1")
    ids = await job_reads.prefix_slice(searched_table, f, cursor)
    assert ids is not None
    assert ids.top == (cursor.id if cursor else ROWS + 1) and ids.floor == ids.top - 2_000
    args = job_reads.list_args("list_jobs", f, ListCursor(ids.top), 100, slice_floor=ids.floor)
    text, page = await ran(searched_table, args)
    assert_no_job_scan(text)
    assert "jobs_key_prefix_id" not in text and "jobs_key_key" not in text, text
    assert not branch_ran(text, "matched") and not branch_ran(text, "walked"), text
    (walk,) = walked_ids(text)
    assert 0 < walk <= 2_000, text
    assert page == expected
    assert page == [n for n in expected_ids("order-1", ids.top) if n >= ids.floor][:100]


async def test_a_prefix_under_the_count_is_not_sliced(searched_table: asyncpg.Pool) -> None:
    """order-4711 matches 11 keys: the count stops there, and the page is the index's."""
    f = JobFilter(key_prefix="order-4711")
    assert await job_reads.prefix_slice(searched_table, f, None) is None
    assert await job_reads.prefix_slice(searched_table, JobFilter(), None) is None


async def test_bulk_actions_select_by_prefix_as_the_list_does(searched_table: asyncpg.Pool) -> None:
    """bulk.py counts the pages of list_jobs by state (list_jobs inside a larger statement)."""
    args = args_for("list_jobs", ListCursor(ROWS + 1), key_prefix="order-1")
    rows = await searched_table.fetch(
        f"SELECT state, count(*)::int AS n FROM ({query('list_jobs')}) page"
        " GROUP BY state ORDER BY state",
        *args,
    )
    assert {r["state"]: r["n"] for r in rows} == {"dead": 10, "succeeded": 90}
