"""Each claim of a drain costs the same, not more than the one before it (db/queries.sql,
claim_ready; its walk of the ready jobs runs in dispatcher.claim_pick, migration 023, whose
statements auto_explain shows).

A drain starts from a table of due jobs analyzed while every one of them was ready; with those
statistics the planner walks a tenant's ready jobs on the primary key, in id order. From the
lowest id, each claim stepped over every job claimed before it (the 20th claim of 1,000 over
19,000 rows) before it found a ready one. The walk starts at the tenant's first ready job.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from dispatcher.db.jobs import JobRepository
from dispatcher.db.queries import query
from tests.harness import enqueue_noop_jobs

JOBS = 5_000
BATCH = 500
CLAIMS_BEFORE = 6


def scans_under_locks(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The scans that feed a LockRows node (the claim's walk of a tenant's ready jobs)."""
    found = []
    if node["Node Type"] == "LockRows":
        found += [child for child in node.get("Plans", []) if "Scan" in child["Node Type"]]
    for child in node.get("Plans", []):
        found += scans_under_locks(child)
    return found


@asynccontextmanager
async def nested_plans(conn: asyncpg.Connection) -> AsyncIterator[list[dict[str, Any]]]:
    """The executed plans of every statement `conn` runs meanwhile, functions' statements
    included (auto_explain, sent to the client as notices)."""
    plans: list[dict[str, Any]] = []

    def collect(_conn: Any, message: Any) -> None:
        text = message.message
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1])["Plan"])

    await conn.execute("LOAD 'auto_explain'")
    await conn.execute(
        "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
        " SET auto_explain.log_analyze = on; SET auto_explain.log_format = json;"
        " SET auto_explain.log_level = notice"
    )
    conn.add_log_listener(collect)
    try:
        yield plans
    finally:
        conn.remove_log_listener(collect)
        # no session state left behind on a pooled connection (the settings; the library
        # stays loaded, inert with logging off)
        await conn.execute("SET auto_explain.log_min_duration = -1; RESET ALL")


async def test_a_claim_late_in_a_drain_steps_over_no_claimed_job(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    await drain_start(pool, JOBS)  # the statistics of a drain's start
    for _ in range(CLAIMS_BEFORE):
        jobs, _ = await repo.claim("default", BATCH, ["noop:1"], "owner", 60.0)
        assert len(jobs) == BATCH
    async with pool.acquire() as conn:
        async with nested_plans(conn) as plans:
            await conn.fetch(
                query("claim_ready"),
                "default",
                BATCH,
                ["noop:1"],
                "owner",
                60.0,
                2**62,  # no memory budget
                True,
                None,  # no cursor: the walk starts at the first tenant
                None,
            )
        claimed = await conn.fetchval(
            "SELECT count(*) FROM dispatcher.job_state WHERE state = 'running'"
        )
    assert claimed == (CLAIMS_BEFORE + 1) * BATCH  # the explained claim ran too
    scans = [scan for plan in plans for scan in scans_under_locks(plan)]
    assert scans, json.dumps(plans, indent=1)
    for scan in scans:
        # what the walk read and threw away: jobs claimed before (their running versions)
        assert scan.get("Rows Removed by Filter", 0) < BATCH, json.dumps(scan, indent=1)
    # and the start reads each job's state row by its key: a plan kept from the drain's start
    # joined them by merge, reading the primary key from the first job to the last claimed
    assert_jobs_read_by_index(plans)


JOB_TABLES = ("job_state", "intents")  # the claim reads a job's state row, then its intent
KEPT_FROM_EMPTY = 8  # claims on an empty table: more than the 5 custom plans before a kept one
BURST = 20_000


async def test_plans_kept_from_an_empty_table_still_walk_the_claim_index(
    pool: asyncpg.Pool,
) -> None:
    """claim_ready, claim_pick and claim_grant keep their statements' plans per connection
    (10_claim_pick.sql, 10_claim_ready.sql). A daemon starts on an empty table and claims; then a
    burst lands before autovacuum analyzes it. The kept plans must still reach the ready jobs
    through jobs_ready_claim and their intents by primary key, not read a whole table (a
    sequential scan planned for an empty table, or a bitmap scan and a sort)."""
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    await pool.execute("ALTER TABLE dispatcher.job_state SET (autovacuum_enabled = false)")
    await pool.execute("ALTER TABLE dispatcher.intents SET (autovacuum_enabled = false)")
    await pool.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")
    args = ("default", BATCH, ["noop:1"], "owner", 60.0, 2**62, True)
    async with pool.acquire() as conn:
        for _ in range(KEPT_FROM_EMPTY):
            assert len(await conn.fetch(query("claim_ready"), *args, None, None)) == 1  # marker
        await enqueue_noop_jobs(pool, "burst", BURST)
        async with nested_plans(conn) as plans:
            rows = await conn.fetch(query("claim_ready"), *args, None, None)
    assert len(rows) == BATCH + 1
    assert_jobs_read_by_index(plans)


def assert_jobs_read_by_index(plans: list[dict[str, Any]]) -> None:
    """No scan of a job table is sequential or reads more than twice the batch."""
    text = json.dumps(plans, indent=1)
    for plan in plans:
        for node in walk(plan):
            if node.get("Relation Name") in JOB_TABLES and "Scan" in node["Node Type"]:
                assert node["Node Type"] != "Seq Scan", text
                read = node["Actual Rows"] * node["Actual Loops"]
                assert read + node.get("Rows Removed by Filter", 0) <= 2 * BATCH, text


def assert_nothing_reread(plans: list[dict[str, Any]]) -> None:
    """No node reads its input over and over: rows x loops at most 4 x the batch (a kept plan
    once joined the rows it found with the arrays by rescanning them per row: a million rows,
    200 ms for a batch of 1,000), and no sequential scan."""
    text = json.dumps(plans, indent=1)
    for plan in plans:
        for node in walk(plan):
            assert node["Node Type"] != "Seq Scan", text
            assert node.get("Actual Rows", 0) * node.get("Actual Loops", 1) <= 4 * BATCH, text


def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    """`node` and every node under it."""
    return [node, *(n for child in node.get("Plans", []) for n in walk(child))]


async def test_the_kept_plan_of_complete_succeeded_reads_its_jobs_by_id(
    pool: asyncpg.Pool,
) -> None:
    """complete_succeeded keeps its plan per connection (10_complete_succeeded.sql), made on an
    empty table; completing a claim of a burst must still read each job by its primary key."""
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    await pool.execute("ALTER TABLE dispatcher.job_state SET (autovacuum_enabled = false)")
    await pool.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")
    complete = query("complete_succeeded")
    async with pool.acquire() as conn:
        for _ in range(KEPT_FROM_EMPTY):  # nothing to complete: plans made on an empty table
            assert await conn.fetch(complete, [1], [1], ["{}"], "owner", None, None, None) == []
        await enqueue_noop_jobs(pool, "burst", BURST)
        claimed = await conn.fetch(
            query("claim_ready"), "default", BATCH, ["noop:1"], "owner", 60.0, 2**62, True,
            None, None,
        )  # fmt: skip
        ids = [r["id"] for r in claimed if r["id"] is not None]
        async with nested_plans(conn) as plans:
            done = await conn.fetch(
                complete, ids, [1] * len(ids), ["{}"] * len(ids), "owner", None, None, None
            )
    assert len(done) == BATCH
    text = json.dumps(plans, indent=1)
    tables = {n.get("Relation Name") for plan in plans for n in walk(plan)}
    assert "job_state" in tables, text  # the update's plan was seen
    assert_nothing_reread(plans)
    assert_jobs_read_by_index(plans)


async def test_the_kept_plan_of_the_idle_look_walks_the_claim_index(pool: asyncpg.Pool) -> None:
    """ready_after_intake (10_wake.sql), a claim loop's last look before it waits, keeps its
    plan per connection, made on an empty table; after a burst it must still find the first
    ready job through jobs_ready_claim, not read the state rows."""
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    await pool.execute("ALTER TABLE dispatcher.job_state SET (autovacuum_enabled = false)")
    await pool.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")
    look = "SELECT dispatcher.ready_after_intake('default', ARRAY['noop:1'])"
    async with pool.acquire() as conn:
        for _ in range(KEPT_FROM_EMPTY):
            assert await conn.fetchval(look) is False
        await enqueue_noop_jobs(pool, "burst", BURST)
        async with nested_plans(conn) as plans:
            assert await conn.fetchval(look) is True
    text = json.dumps(plans, indent=1)
    assert "jobs_ready_claim" in text, text
    assert_jobs_read_by_index(plans)


async def test_plans_kept_from_an_empty_table_read_many_small_tenants_once(
    pool: asyncpg.Pool,
) -> None:
    """The same for a burst of 10,000 tenants of two jobs each (claim_firsts,
    10_claim_firsts.sql): the kept plans read the claim index once and lock by row address;
    no node reads its input over and over."""
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    await pool.execute("ALTER TABLE dispatcher.job_state SET (autovacuum_enabled = false)")
    await pool.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")
    args = ("default", BATCH, ["noop:1"], "owner", 60.0, 2**62, True)
    async with pool.acquire() as conn:
        cursor = (0, "")
        for _ in range(KEPT_FROM_EMPTY):
            assert len(await conn.fetch(query("claim_ready"), *args, *cursor)) == 1
        await pool.execute(f"""
            SELECT count(*) FROM dispatcher.enqueue_many(
                   (SELECT array_agg('t-' || g) FROM generate_series(1, {BURST}) g),
                   array_fill('noop'::text, ARRAY[{BURST}]),
                   array_fill('{{}}'::jsonb, ARRAY[{BURST}]),
                   tenants => (SELECT array_agg('t' || g % {BURST // 2})
                                 FROM generate_series(1, {BURST}) g))""")
        async with nested_plans(conn) as plans:
            rows = await conn.fetch(query("claim_ready"), *args, *cursor)
    assert len(rows) == BATCH + 1
    assert len({r["tenant"] for r in rows[:-1]}) == BATCH  # one job of each of 500 tenants
    text = json.dumps(plans, indent=1)
    assert any("claim_firsts" in json.dumps(p) or "row_at" in json.dumps(p) for p in plans), text
    assert_nothing_reread(plans)


async def drain_start(pool: asyncpg.Pool, jobs: int, tenants: int = 0) -> None:
    """`jobs` ready no-op jobs (over `tenants` tenants, when given), analyzed as a drain finds
    them: every one ready, statistics that nothing updates meanwhile."""
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    await enqueue_noop_jobs(pool, "drain", jobs, tenants=tenants)
    await pool.execute("ALTER TABLE dispatcher.job_state SET (autovacuum_enabled = false)")
    await pool.execute("ALTER TABLE dispatcher.intents SET (autovacuum_enabled = false)")
    await pool.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")


async def test_the_turns_claim_late_in_a_drain_reads_its_jobs_by_key(pool: asyncpg.Pool) -> None:
    """The claim's other statement (tenants taking turns) keeps its plan per connection too,
    made at a drain's start on a full table: a late claim must still reach each job it starts
    by its key, not join the state rows by a merge or hash that reads the table from its
    first row (the plain case's start did, 2026-12-07)."""
    await drain_start(pool, JOBS, tenants=50)
    args = ("default", BATCH, ["noop:1"], "owner", 60.0, 2**62, True)
    async with pool.acquire() as conn:
        cursor: tuple[int | None, str | None] = (None, None)
        for _ in range(CLAIMS_BEFORE):  # the plan is made by the first and kept
            rows = await conn.fetch(query("claim_ready"), *args, *cursor)
            assert len(rows) == BATCH + 1
            cursor = (rows[-1]["cursor_priority"], rows[-1]["cursor_tenant"])
        async with nested_plans(conn) as plans:
            rows = await conn.fetch(query("claim_ready"), *args, *cursor)
    assert len(rows) == BATCH + 1
    assert len({r["tenant"] for r in rows[:-1]}) == 50  # the turns' statement, not the plain one
    assert_jobs_read_by_index(plans)
    assert_nothing_reread(plans)


async def test_a_completion_late_in_a_drain_reads_its_jobs_by_key(pool: asyncpg.Pool) -> None:
    """complete_succeeded's plan, kept per connection, made by a drain's first completion on a
    full table: a late completion still reads only the jobs it completes."""
    await drain_start(pool, JOBS)
    complete = query("complete_succeeded")
    claim = query("claim_ready")
    args = ("default", BATCH, ["noop:1"], "owner", 60.0, 2**62, True, None, None)
    async with pool.acquire() as conn:

        async def claim_and_complete() -> list[Any]:
            ids = [r["id"] for r in await conn.fetch(claim, *args) if r["id"] is not None]
            assert len(ids) == BATCH
            n = len(ids)
            return await conn.fetch(complete, ids, [1] * n, ["{}"] * n, "owner", None, None, None)

        for _ in range(CLAIMS_BEFORE):  # the plan is made by the first and kept
            assert len(await claim_and_complete()) == BATCH
        async with nested_plans(conn) as plans:  # (the claim's plans are read too)
            done = await claim_and_complete()
    assert len(done) == BATCH
    assert_jobs_read_by_index(plans)
    assert_nothing_reread(plans)


async def test_a_steady_streams_claim_of_one_job_starts_few_plan_nodes(
    pool: asyncpg.Pool,
) -> None:
    """A steady stream's claim finds the one job just enqueued: claim_ready's one-job case
    (10_claim_ready.sql) claims it in statements of a few plan nodes, as most of such a claim's
    cost is starting its plans. Kept from an empty table and run after a burst was claimed, they
    read the job by key, and they start fewer than half the plan nodes of the walk's claim of
    two jobs."""
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    await pool.execute("ALTER TABLE dispatcher.job_state SET (autovacuum_enabled = false)")
    await pool.execute("ALTER TABLE dispatcher.intents SET (autovacuum_enabled = false)")
    await pool.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")
    args = ("default", BATCH, ["noop:1"], "owner", 60.0, 2**62, True, None, None)
    async with pool.acquire() as conn:
        for _ in range(KEPT_FROM_EMPTY):
            assert len(await conn.fetch(query("claim_ready"), *args)) == 1  # the marker alone
        await enqueue_noop_jobs(pool, "burst", JOBS)
        while len(await conn.fetch(query("claim_ready"), *args)) > 1:
            pass  # the burst claimed: its rows stay running behind the stream
        await enqueue_noop_jobs(pool, "one", 1)
        async with nested_plans(conn) as one:
            assert len(await conn.fetch(query("claim_ready"), *args)) == 2
        await enqueue_noop_jobs(pool, "two", 2)
        async with nested_plans(conn) as two:
            assert len(await conn.fetch(query("claim_ready"), *args)) == 3
    text = json.dumps(one, indent=1)
    for plan in one:
        for node in walk(plan):
            if node.get("Relation Name") in JOB_TABLES:
                assert node["Node Type"] != "Seq Scan", text
                assert node["Actual Rows"] * node["Actual Loops"] <= 2, text
    # the probe (the first statement, the same in both) aside: the one job's statements start
    # a few nodes each, and fewer than half of the walk's in all
    after_probe = {"one": [len(walk(p)) for p in one[1:]], "two": [len(walk(p)) for p in two[1:]]}
    assert max(after_probe["one"]) <= 4 < max(after_probe["two"]), after_probe
    assert 2 * sum(after_probe["one"]) < sum(after_probe["two"]), after_probe
