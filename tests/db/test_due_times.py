"""Due times the dispatcher cannot schedule by: refused at the SQL door with SQLSTATE 22008 and a
hint naming the range, and harmless when such a row is already stored (written before migration
006 or straight into the table): claims of its queue, the due-scan and the metrics still work."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from dispatcher.cron.expression import EARLIEST_INSTANT, LATEST_INSTANT
from dispatcher.db import schema
from dispatcher.db.jobs import JobRepository
from dispatcher.engine.due_scan import DueScanner
from dispatcher.runtime.timing import TimingEngine
from tests.conftest import scratch_database
from tests.harness import wait_until

TARGET = json.dumps({"url": "https://hooks.example.com/grants"})
OWNER = "test-worker"
# Outside the range, each for its own reason: not a time at all, just before the first
# instant, just after the last, and years Python cannot represent.
OUT_OF_RANGE = [
    "-infinity",
    "infinity",
    "1999-12-31 23:59:59.999999+00",
    "9999-12-31 23:59:59.000001+00",
    "1970-01-01 00:00:00+00",
    "4713-01-01 00:00:00+00 BC",
    "20000-01-01 00:00:00+00",
]
# the out-of-range times after today
LATER = ("infinity", "9999-12-31 23:59:59.000001+00", "20000-01-01 00:00:00+00")
ENQUEUE = "SELECT dispatcher.enqueue($1, 'http', '{}', $2::text::timestamptz, target => $3::jsonb)"
ENQUEUE_MANY = """
SELECT ord, id, state, outcome FROM dispatcher.enqueue_many(
    $1::text[], ARRAY['http', 'http'], ARRAY['{}', '{}']::jsonb[],
    due_ats => $2::text[]::timestamptz[], targets => ARRAY[$3, $3]::jsonb[])
"""


async def jobs_and_outbox(conn: asyncpg.Connection) -> tuple[int, int]:
    return (
        await conn.fetchval("SELECT count(*) FROM dispatcher.jobs"),
        await conn.fetchval("SELECT count(*) FROM dispatcher.outbox"),
    )


# the SQL door ---------------------------------------------------------------------------------
@pytest.mark.parametrize("due", OUT_OF_RANGE)
async def test_enqueue_refuses_a_due_time_out_of_range_with_22008(
    conn: asyncpg.Connection, due: str
) -> None:
    with pytest.raises(asyncpg.DatetimeFieldOverflowError) as raised:
        await conn.fetchval(ENQUEUE, "bad-due", due, TARGET)
    assert raised.value.sqlstate == "22008"
    assert "due_at" in str(raised.value) and "out of range" in str(raised.value)
    hint = raised.value.hint or ""
    assert "2000-01-01T00:00:00Z" in hint and "9999-12-31T23:59:59Z" in hint, hint
    assert "NULL" in hint  # how to fix it: omit the time to run now
    assert await jobs_and_outbox(conn) == (0, 0)


@pytest.mark.parametrize("due", OUT_OF_RANGE)
async def test_enqueue_many_refuses_the_call_naming_the_item(
    conn: asyncpg.Connection, due: str
) -> None:
    with pytest.raises(asyncpg.DatetimeFieldOverflowError, match="item 2") as raised:
        await conn.fetch(ENQUEUE_MANY, ["fine", "bad-due"], [None, due], TARGET)
    assert raised.value.sqlstate == "22008"
    assert "9999-12-31T23:59:59Z" in (raised.value.hint or "")
    assert await jobs_and_outbox(conn) == (0, 0)


async def test_the_first_and_last_instants_are_accepted_at_both_doors(
    conn: asyncpg.Connection,
) -> None:
    """The range holds at the daemon's door (what HTTP intake and cron call); the SQL door
    takes the last instant and refuses the first as long past (migration 011), not as out of
    range."""
    first, last = "2000-01-01 00:00:00+00", "9999-12-31 23:59:59+00"
    await conn.fetchval(ENQUEUE, "last", last, TARGET)
    with pytest.raises(asyncpg.InvalidParameterValueError, match="in the past"):
        await conn.fetchval(ENQUEUE, "first", first, TARGET)
    rows = await conn.fetch(
        ENQUEUE_MANY.replace("enqueue_many(", "enqueue_many_internal("),
        ["first-b", "last-b"],
        [first, last],
        TARGET,
    )
    assert [(r["state"], r["outcome"]) for r in rows] == [
        ("ready", "created"),
        ("scheduled", "created"),
    ]
    stored = await conn.fetch("SELECT key, state, due_at FROM dispatcher.jobs ORDER BY id")
    assert [(r["key"], r["state"], r["due_at"]) for r in stored] == [
        ("last", "scheduled", LATEST_INSTANT),
        ("first-b", "ready", EARLIEST_INSTANT),
        ("last-b", "scheduled", LATEST_INSTANT),
    ]


async def test_python_and_sql_agree_on_the_range(conn: asyncpg.Connection) -> None:
    bounds = await conn.fetchrow(
        "SELECT lower(r) AS low, upper(r) AS high, lower_inc(r) AND upper_inc(r) AS closed"
        " FROM dispatcher.due_at_range() AS r"
    )
    assert (bounds["low"], bounds["high"], bounds["closed"]) == (
        EARLIEST_INSTANT,
        LATEST_INSTANT,
        True,
    )


async def test_the_state_tables_checks_hold_the_same_range_as_constants(
    conn: asyncpg.Connection,
) -> None:
    """Migration 049: the checks compare against a literal range (calling due_at_range() ran
    it, planned anew, twice per state-row write); it must stay the function's range."""
    ranges = await conn.fetch(
        "SELECT c.conname, (regexp_match(pg_get_constraintdef(c.oid),"
        "        $$'([^']+)'::tstzrange$$))[1]::tstzrange = dispatcher.due_at_range() AS same,"
        "       pg_get_constraintdef(c.oid) LIKE '%due_at_range%' AS calls"
        "  FROM pg_constraint c WHERE c.conrelid = 'dispatcher.job_state'::regclass"
        "   AND c.conname IN ('job_state_due_at_in_range', 'job_state_expires_at_range')"
    )
    assert {r["conname"]: (r["same"], r["calls"]) for r in ranges} == {
        "job_state_due_at_in_range": (True, False),
        "job_state_expires_at_range": (True, False),
    }


async def test_the_range_folds_without_planning_a_statement(conn: asyncpg.Connection) -> None:
    """10_due_at_range.sql: a statement planned per call folds due_at_range() by running it; as
    a SQL function that planned its body every time (5.5 us), as PL/pgSQL it does not."""
    kind = await conn.fetchrow(
        "SELECT l.lanname, p.provolatile::text FROM pg_proc p"
        "  JOIN pg_language l ON l.oid = p.prolang"
        " WHERE p.oid = 'dispatcher.due_at_range'::regproc"
    )
    assert tuple(kind) == ("plpgsql", "i")


async def test_a_row_written_straight_into_the_table_is_checked_too(
    conn: asyncpg.Connection,
) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match="job_state_due_at_in_range"):
        await insert_raw(conn, "raw", "ready", "-infinity")


# rows already stored --------------------------------------------------------------------------
async def insert_raw(conn: asyncpg.Connection, key: str, state: str, due: str) -> int:
    """A job written with plain SQL, bypassing both doors, with its outbox row when ready."""
    job_id: int = await conn.fetchval(
        """INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, target, payload, state,
                                        due_at, max_attempts, max_retry_age_s, budget_started_at)
           VALUES ($1, 'raw', 'default', 'http', $3::jsonb, '{}', $2, $4::text::timestamptz, 10,
                   86400, $4::text::timestamptz)
           RETURNING id""",
        key,
        state,
        TARGET,
        due,
    )
    if state == "ready":
        await conn.execute(
            "INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)"
            " VALUES ($1, 'default', '', 'http:1')",
            job_id,
        )
    return job_id


@pytest.fixture
async def poisoned(conn: asyncpg.Connection) -> list[str]:
    """Bad rows stored before any good one (so every claim meets them first): as a database
    from before migration 006 had them, or anyone who drops the constraint can write them."""
    await conn.execute("ALTER TABLE dispatcher.job_state DROP CONSTRAINT job_state_due_at_in_range")
    keys = []
    for i, due in enumerate(OUT_OF_RANGE):
        for state in ("ready", "scheduled"):
            keys.append(f"poison-{state}-{i}")
            await insert_raw(conn, keys[-1], state, due)
    return keys


async def test_claims_of_the_queue_go_on_past_bad_rows(
    conn: asyncpg.Connection, repo: JobRepository, poisoned: list[str]
) -> None:
    good = await conn.fetchval(ENQUEUE, "good", None, TARGET)
    claimed: list[Any] = []
    for _ in range(10):  # every ready row, one claim at a time
        jobs, _taken = await repo.claim("default", 1, ["http:1"], OWNER, 30)
        claimed += jobs
    keys = [j.key for j in claimed]
    assert "good" in keys
    # a ready row due later (in the claim index early, as the due-scan moves jobs ahead of
    # their due time) is not started before it: 'infinity', 9999 and 20000 stay ready
    later = {f"poison-ready-{i}" for i, due in enumerate(OUT_OF_RANGE) if due in LATER}
    assert len(later) == len(LATER)
    started = [k for k in poisoned if "-ready-" in k and k not in later]
    assert sorted(keys) == sorted([*started, "good"])
    for job in claimed:
        assert job.due_to_start_s >= 0 and job.due_to_start_s < float("inf")
        assert EARLIEST_INSTANT <= job.due_at <= LATEST_INSTANT  # a time Python can hold
    assert await conn.fetchval("SELECT state FROM dispatcher.jobs WHERE id = $1", good) == (
        "running"
    )


@pytest.mark.parametrize("due", [due for due in OUT_OF_RANGE if due not in LATER])
async def test_a_bad_row_claimed_alone_is_reported_in_range(
    conn: asyncpg.Connection, repo: JobRepository, due: str
) -> None:
    """A steady stream's claim finds one ready job, which claim_ready takes in statements of
    its own (its one-job case): a bad due time must not fail that claim either."""
    await conn.execute("ALTER TABLE dispatcher.job_state DROP CONSTRAINT job_state_due_at_in_range")
    await insert_raw(conn, "alone", "ready", due)
    jobs, taken = await repo.claim("default", 10, ["http:1"], OWNER, 30)
    assert [j.key for j in jobs] == ["alone"] and taken == 1
    assert jobs[0].due_to_start_s == 0
    assert EARLIEST_INSTANT <= jobs[0].due_at <= LATEST_INSTANT


async def test_a_big_claim_takes_good_and_bad_rows_together(
    conn: asyncpg.Connection, repo: JobRepository, poisoned: list[str]
) -> None:
    await conn.fetchval(ENQUEUE, "good", None, TARGET)
    jobs, taken = await repo.claim("default", 100, ["http:1"], OWNER, 30)
    assert taken == len(jobs) == len(OUT_OF_RANGE) - len(LATER) + 1


async def test_the_due_scan_and_metrics_queries_never_fail_on_bad_rows(
    conn: asyncpg.Connection,
    repo: JobRepository,
    poisoned: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    later = datetime(2031, 5, 31, tzinfo=UTC)
    await conn.fetchval(ENQUEUE, "later", later.isoformat(), TARGET)
    # the scheduled -infinity, BC and 1970/1999 rows are due: they move to ready
    ready = "SELECT count(*) FROM dispatcher.job_state WHERE state = 'ready'"
    ready_before = await conn.fetchval(ready)
    timing = TimingEngine()
    scanner = DueScanner(repo, timing, batch=2, interval_s=0.05, on_ready=lambda: None)
    assert await scanner.run_once() == 4
    assert await conn.fetchval(ready) == ready_before + 4

    wait = await repo.seconds_to_next_due()  # the earliest left is 2031 (then 9999, infinity)
    assert wait is not None and 0 < wait <= (later - datetime.now(UTC)).total_seconds() + 60
    overdue = await repo.count_overdue(60.0)
    assert overdue == {"default": 2 * 4}  # the ready ones and the newly moved ones
    assert (await repo.oldest_ready_age())["default"] >= 0

    # the scanner's own loop, a few rounds: no "due-scan failed" (it used to log one a second)
    rounds = 0
    next_due = repo.seconds_to_next_due

    async def counted() -> float | None:
        nonlocal rounds
        rounds += 1
        return await next_due()

    repo.seconds_to_next_due = counted  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="dispatcher.engine.due_scan"):
        await timing.start()
        await scanner.start()
        try:
            await wait_until(lambda: rounds >= 3, timeout_s=10, what="three scan rounds")
        finally:
            await scanner.stop()
            await timing.stop()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_only_unreachable_rows_left_make_the_scan_wait_its_interval(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    await conn.execute("ALTER TABLE dispatcher.job_state DROP CONSTRAINT job_state_due_at_in_range")
    await insert_raw(conn, "never", "scheduled", "infinity")
    assert await repo.seconds_to_next_due() == float("inf")  # the caller waits its interval
    await insert_raw(conn, "long-ago", "scheduled", "-infinity")
    assert await repo.seconds_to_next_due() == 0.0


async def test_a_ready_job_with_a_non_finite_due_time_does_not_break_the_ready_age(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    job_id = await conn.fetchval(ENQUEUE, "good", None, TARGET)
    await conn.execute("ALTER TABLE dispatcher.job_state DROP CONSTRAINT job_state_due_at_in_range")
    await conn.execute("UPDATE dispatcher.job_state SET due_at = '-infinity' WHERE id = $1", job_id)
    assert (await repo.oldest_ready_age())["default"] == float("inf")


# migration 006 on a database that already holds such rows -------------------------------------
async def test_migration_006_retires_non_finite_rows_and_clamps_the_rest(
    server_url: str,
) -> None:
    async with scratch_database(server_url, "dispatcher_pre_006") as url:
        conn = await asyncpg.connect(url)
        try:
            everything = schema.available()
            await schema.migrate(conn, upto=5)
            rows = {
                "ready-neg": ("ready", "-infinity"),
                "sched-pos": ("scheduled", "infinity"),
                "sched-old": ("scheduled", "1970-01-01 00:00:00+00"),
                "sched-far": ("scheduled", "20000-01-01 00:00:00+00"),
                "done-neg": ("succeeded", "-infinity"),
                "fine": ("scheduled", "2031-05-31 00:00:00+00"),
            }
            for key, (state, due) in rows.items():
                await insert_raw(conn, key, state, due)
            await conn.execute(
                "UPDATE dispatcher.jobs SET finished_at = now() WHERE state = 'succeeded'"
            )
            applied = await schema.migrate(conn)
            assert [n for n in applied if "/" not in n] == [name for _, name, _ in everything[5:]]

            after = {
                r["key"]: r
                for r in await conn.fetch(
                    "SELECT key, state, dead_reason, last_error, due_at, budget_started_at,"
                    " finished_at, (SELECT count(*) FROM dispatcher.outbox o"
                    "  WHERE o.job_id = j.id) AS outbox FROM dispatcher.jobs j"
                )
            }
        finally:
            await conn.close()
    # not a time: dead, with the reason and the original value, its delivery withdrawn
    for key, was in (("ready-neg", "-infinity"), ("sched-pos", "infinity")):
        row = after[key]
        assert (row["state"], row["dead_reason"], row["outbox"]) == ("dead", "invalid_due_at", 0)
        assert was in row["last_error"] and "retry" in row["last_error"]
        assert row["finished_at"] is not None
    # a time, but out of range: brought to the nearest end, same meaning (due / never)
    assert (after["sched-old"]["state"], after["sched-old"]["due_at"]) == (
        "scheduled",
        EARLIEST_INSTANT,
    )
    assert (after["sched-far"]["state"], after["sched-far"]["due_at"]) == (
        "scheduled",
        LATEST_INSTANT,
    )
    assert after["done-neg"]["state"] == "succeeded"
    assert after["fine"]["due_at"] == datetime(2031, 5, 31, tzinfo=UTC)
    for row in after.values():
        assert EARLIEST_INSTANT <= row["due_at"] <= LATEST_INSTANT
        assert EARLIEST_INSTANT <= row["budget_started_at"] <= LATEST_INSTANT
