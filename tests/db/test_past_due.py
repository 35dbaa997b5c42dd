"""Due times in the past (migration 011): the SQL door refuses one more than the daemon's
`due_at_past_tolerance_s` ago, as the HTTP API does, with SQLSTATE 22023 naming the fix; the
daemon's own door (HTTP intake, cron catch-up of past periods) still takes them; and a job's
retry budget starts when it is accepted or due, whichever is later, so a job accepted with a
past due time is not dead at its first failure."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import asyncpg
import pytest

from dispatcher.config.settings import Settings
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.cron.service import CronService
from dispatcher.db import schema
from dispatcher.db.jobs import JobRepository
from dispatcher.model import Job, NewJob
from tests.conftest import scratch_database
from tests.harness import make_settings, running_daemon

# the registry a daemon writes at start (the shared `registry` fixture registers it)
pytestmark = pytest.mark.registry(
    {"default": (5, 3600)}, {"work": ("python", 1)}, due_at_past_tolerance_s=60
)

OWNER = "host:1:past"
TARGET = json.dumps({"url": "https://hooks.example.com/grants"})
ENQUEUE = (
    "SELECT dispatcher.enqueue($1, 'http', '{}', now() + make_interval(secs => $2),"
    " target => $3::jsonb)"
)
ENQUEUE_MANY = """
SELECT ord, id, state, outcome FROM dispatcher.enqueue_many(
    $1::text[], ARRAY['http', 'http'], ARRAY['{}', '{}']::jsonb[],
    due_ats => ARRAY[now() + make_interval(secs => $2), now() + make_interval(secs => $3)],
    targets => ARRAY[$4, $4]::jsonb[])
"""


async def stored(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM dispatcher.jobs"))


# the SQL door ---------------------------------------------------------------------------------
async def test_enqueue_refuses_a_due_time_past_the_tolerance_and_names_the_fix(
    registry: JobRepository, conn: asyncpg.Connection
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError) as raised:
        await conn.fetchval(ENQUEUE, "too-old", -120.0, TARGET)
    assert raised.value.sqlstate == "22023"
    assert "due_at" in str(raised.value) and "more than 60 s in the past" in str(raised.value)
    hint = raised.value.hint or ""
    assert "NULL" in hint and "due_at_past_tolerance_s" in hint, hint
    assert await stored(conn) == 0

    job_id = await conn.fetchval(ENQUEUE, "a-little-late", -30.0, TARGET)  # within tolerance
    state = await conn.fetchval("SELECT state FROM dispatcher.jobs WHERE id = $1", job_id)
    assert state == "ready"


async def test_enqueue_many_refuses_the_call_naming_the_item(
    registry: JobRepository, conn: asyncpg.Connection
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match=r"\(item 2\)") as raised:
        await conn.fetch(ENQUEUE_MANY, ["fine", "too-old"], 3600.0, -3600.0, TARGET)
    assert "more than 60 s in the past" in str(raised.value)
    assert await stored(conn) == 0  # the whole call changed nothing
    rows = await conn.fetch(ENQUEUE_MANY, ["later", "now-ish"], 3600.0, -30.0, TARGET)
    assert [(r["state"], r["outcome"]) for r in rows] == [
        ("scheduled", "created"),
        ("ready", "created"),
    ]


async def test_out_of_range_is_still_refused_as_out_of_range(
    registry: JobRepository, conn: asyncpg.Connection
) -> None:
    """A time before 2000 is past too; the range refusal (22008) keeps its own message."""
    sql = "SELECT dispatcher.enqueue('x', 'http', '{}', '-infinity', target => $1::jsonb)"
    with pytest.raises(asyncpg.DatetimeFieldOverflowError):
        await conn.fetchval(sql, TARGET)


async def test_the_tolerance_follows_the_configuration_and_defaults_alike(
    repo: JobRepository, conn: asyncpg.Connection
) -> None:
    tolerance = "SELECT dispatcher.due_at_past_tolerance_s()"
    # before any daemon started: the configuration's default
    assert await conn.fetchval(tolerance) == Settings().due_at_past_tolerance_s
    await repo.sync_registry({}, {}, due_at_past_tolerance_s=7200)  # a daemon's start
    assert await conn.fetchval(tolerance) == 7200
    await conn.fetchval(ENQUEUE, "an-hour-late", -3600.0, TARGET)  # accepted now
    await repo.sync_registry({}, {}, due_at_past_tolerance_s=0)
    with pytest.raises(asyncpg.InvalidParameterValueError, match="more than 0 s"):
        await conn.fetchval(ENQUEUE, "a-second-late", -1.0, TARGET)


# the daemon's own door ------------------------------------------------------------------------
async def test_the_daemons_door_takes_a_past_due_time(registry: JobRepository) -> None:
    """HTTP intake checks the tolerance itself, per item; this door does not refuse."""
    past = await registry.now() - timedelta(days=3)
    [result] = await registry.enqueue_many(
        [NewJob(key="internal-past", handler="work", payload={}, due_at=past)]
    )
    assert (result.outcome, result.state, result.due_at) == ("created", "ready", past)


def nightly() -> ScheduleSettings:
    return ScheduleSettings.model_validate(
        {"name": "nightly", "cron": "0 2 * * *", "handler": "work", "misfire_grace_s": 60}
    )


async def test_catch_up_of_a_week_old_period_still_goes_through(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    """Cron catch-up uses the daemon's door: a period a week old (under a 60 s tolerance) gets
    its run; its unit is due when created and retries after a failure."""
    now = await registry.now()
    period = (now - timedelta(days=7)).replace(hour=2, minute=0, second=0, microsecond=0)
    receipts = await CronService(pool, registry, [nightly()]).catch_up("nightly", period, period)
    assert [r.outcome for r in receipts] == ["created"]
    job = await claim_one(registry)
    assert job.key == f"nightly:{period:%Y-%m-%dT%H:%M:%SZ}:all"
    assert await fail_transiently(registry, job) == ("scheduled", None)


# the retry budget -----------------------------------------------------------------------------
async def claim_one(repo: JobRepository) -> Job:
    jobs, _ = await repo.claim("default", 10, ["work:1"], OWNER, 60)
    assert len(jobs) == 1, jobs
    return jobs[0]


async def fail_transiently(repo: JobRepository, job: Job) -> tuple[str, str | None] | None:
    return await repo.record_failure(
        job, OWNER, permanent=False, delay_s=1, error="503 from target", reason="http_5xx"
    )


async def test_a_job_accepted_with_a_past_due_time_retries_after_its_first_failure(
    registry: JobRepository, pool: asyncpg.Pool
) -> None:
    """Due two hours ago with a one-hour retry age: the budget starts at acceptance."""
    past = await registry.now() - timedelta(hours=2)
    await registry.enqueue_many(
        [NewJob(key="late", handler="work", payload={}, due_at=past, max_retry_age_s=3600)]
    )
    started = await pool.fetchval(
        "SELECT budget_started_at >= created_at FROM dispatcher.jobs WHERE key = 'late'"
    )
    assert started
    job = await claim_one(registry)
    assert await fail_transiently(registry, job) == ("scheduled", None)


async def test_a_future_due_time_still_starts_the_budget_when_due(
    registry: JobRepository, pool: asyncpg.Pool
) -> None:
    later = await registry.now() + timedelta(days=2)
    await registry.enqueue_many([NewJob(key="later", handler="work", payload={}, due_at=later)])
    budget = await pool.fetchval("SELECT budget_started_at FROM dispatcher.jobs WHERE key='later'")
    assert budget == later


async def test_sql_door_budget_starts_at_acceptance_too(
    registry: JobRepository, conn: asyncpg.Connection
) -> None:
    job_id = await conn.fetchval(ENQUEUE, "sql-late", -30.0, TARGET)
    row = await conn.fetchrow(
        "SELECT due_at < created_at AS past, budget_started_at = created_at AS from_acceptance"
        " FROM dispatcher.jobs WHERE id = $1",
        job_id,
    )
    assert (row["past"], row["from_acceptance"]) == (True, True)


async def test_rescheduling_to_a_past_time_starts_the_budget_now(
    registry: JobRepository, pool: asyncpg.Pool
) -> None:
    later = await registry.now() + timedelta(days=2)
    [created] = await registry.enqueue_many(
        [NewJob(key="moved", handler="work", payload={}, due_at=later)]
    )
    past = await registry.now() - timedelta(seconds=30)
    moved = await registry.reschedule(created.id, past)
    assert isinstance(moved, dict) and moved["state"] == "ready"
    assert await pool.fetchval(
        "SELECT budget_started_at > due_at FROM dispatcher.jobs WHERE id = $1", created.id
    )


# the upgrade ----------------------------------------------------------------------------------
async def test_the_migration_moves_waiting_budgets_to_their_acceptance(server_url: str) -> None:
    """A job accepted before 011 with a due time long past gets its acceptance as its budget's
    start; a finished one and a job whose budget a retry reset are left as they were."""
    async with scratch_database(server_url, f"dispatcher_t011_{os.getpid()}") as url:
        conn = await asyncpg.connect(url)
        try:
            await schema.migrate(conn, upto=10)
            rows = [
                ("waiting", "ready", "-2 hours", "-2 hours"),
                ("finished", "succeeded", "-2 hours", "-2 hours"),
                ("retried", "ready", "-2 hours", "+1 second"),
            ]
            for key, state, due, budget in rows:
                await conn.execute(
                    "INSERT INTO dispatcher.jobs (key, request_hash, queue, tenant, handler,"
                    " payload, state, due_at, max_attempts, max_retry_age_s, budget_started_at)"
                    " VALUES ($1, 'h', 'default', '', 'http', '{}', $2,"
                    " now() + $3::text::interval, 5, 3600, now() + $4::text::interval)",
                    key,
                    state,
                    due,
                    budget,
                )
            await schema.migrate(conn)
            found = await conn.fetch(
                "SELECT key, budget_started_at = created_at AS moved FROM dispatcher.jobs"
                " ORDER BY id"
            )
            assert [(r["key"], r["moved"]) for r in found] == [
                ("waiting", True),
                ("finished", False),
                ("retried", False),
            ]
        finally:
            await conn.close()


async def test_a_starting_daemon_writes_its_tolerance_for_the_sql_door(
    db_url: str, conn: asyncpg.Connection
) -> None:
    async with running_daemon(make_settings(db_url, due_at_past_tolerance_s=42)):
        assert await conn.fetchval("SELECT dispatcher.due_at_past_tolerance_s()") == 42
        with pytest.raises(asyncpg.InvalidParameterValueError, match="more than 42 s"):
            await conn.fetchval(ENQUEUE, "from-the-app", -60.0, TARGET)
