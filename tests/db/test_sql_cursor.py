"""Cursor-paged sql handlers on real PostgreSQL: the shipped example deletes exactly the expired
rows of each tenant, page after page from the last cursor; progress `{cursor, pages, rows}`
commits with each page; a run resumes after the recorded cursor; cursor types without a max()
aggregate (uuid) work; statements that cannot page are refused with a reason, and so are
configurations that could not work, when they are loaded."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pydantic import ValidationError

from dispatcher.config.settings import HandlerSettings, load_settings
from dispatcher.cron.service import CronService
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.sql import SqlEffect
from dispatcher.errors import Reject
from dispatcher.model import Job, NewJob

EXAMPLE = (
    Path(__file__).resolve().parents[2] / "config" / "examples" / "session-cleanup-cursor.toml"
)
OWNER = "cursor-test"
# 03:30 in Berlin (CEST) on 2025-06-01: a period start of the example's "30 3 * * *"
PERIOD = datetime(2025, 6, 1, 1, 30, tzinfo=UTC)
TENANTS = ("acme", "globex", "initech", "umbrella")


async def seed_sessions(pool: asyncpg.Pool, per_tenant: int = 1000) -> None:
    """`per_tenant` sessions for each listed tenant and for one the schedule does not list,
    interleaved by id; in every tenant, two of each three expire before the period start."""
    await pool.execute("""
        CREATE SCHEMA app;
        CREATE TABLE app.sessions (
            id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            tenant     text NOT NULL,
            user_id    bigint NOT NULL,
            expires_at timestamptz NOT NULL
        );
        CREATE INDEX sessions_tenant_id ON app.sessions (tenant, id);
    """)
    await pool.execute(
        "INSERT INTO app.sessions (tenant, user_id, expires_at) "
        "SELECT t.name, g, $1::timestamptz + CASE WHEN g % 3 = 0 THEN interval '1 hour' "
        "                                          ELSE interval '-1 hour' END "
        "  FROM generate_series(1, $2) g, unnest($3::text[]) t(name) ORDER BY g, t.name",
        PERIOD,
        per_tenant,
        [*TENANTS, "hooli"],
    )


def completer(repo: JobRepository) -> Any:
    async def complete(conn: Any, job: Job, result: Any) -> bool:
        return await repo.complete_in(conn, job, result, OWNER)

    return complete


async def run_units(repo: JobRepository, effect: SqlEffect, queue: str, capability: str) -> int:
    """Play the worker pool: claim every ready unit and run the effect on it."""
    ran = 0
    while True:
        jobs, _ = await repo.claim(queue, 100, [capability], OWNER, 60)
        if not jobs:
            return ran
        for job in jobs:
            async with repo.connection() as conn:
                await effect.run(job, completer(repo), conn)
            ran += 1


def example_handler(page_size: int) -> tuple[Any, HandlerSettings]:
    settings = load_settings(EXAMPLE, environ={})
    (schedule,) = settings.schedules
    handler = settings.handlers[schedule.handler].model_copy(update={"page_size": page_size})
    return settings, handler


async def test_example_deletes_exactly_the_expired_sessions_of_each_tenant_by_cursor(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    settings, handler = example_handler(page_size=100)
    (schedule,) = settings.schedules
    await repo.sync_registry(
        {name: (q.max_attempts, q.max_retry_age_s) for name, q in settings.queues.items()},
        {schedule.handler: ("sql", handler.version)},
    )
    await seed_sessions(pool)
    expected = {
        r["tenant"]: (r["n"], r["last"])
        for r in await pool.fetch(
            "SELECT tenant, count(*) AS n, max(id) AS last FROM app.sessions "
            "WHERE expires_at < $1 GROUP BY tenant",
            PERIOD,
        )
    }
    kept = await pool.fetchval(
        "SELECT md5(string_agg(id::text, ',' ORDER BY id)) FROM app.sessions "
        "WHERE expires_at >= $1 OR tenant = 'hooli'",
        PERIOD,
    )

    receipt = await CronService(pool, repo, settings.schedules).trigger(schedule.name, PERIOD)
    assert receipt.unit_count == len(TENANTS)
    effect = SqlEffect(schedule.handler, handler, repo, OWNER)
    assert await run_units(repo, effect, schedule.queue, f"{schedule.handler}:1") == 4

    rows = await pool.fetch(
        "SELECT tenant, state, result, progress FROM dispatcher.jobs WHERE run_key = $1",
        receipt.run_key,
    )
    assert {r["state"] for r in rows} == {"succeeded"}
    for row in rows:
        n, last = expected[row["tenant"]]  # 667 expired rows per tenant: 6 full pages + 67
        assert row["result"] == {"cursor": last, "pages": n // 100 + 1, "rows": n}
        # the last full page's progress; the final page committed with the completion
        assert (row["progress"]["pages"], row["progress"]["rows"]) == (n // 100, n // 100 * 100)
    assert (
        await pool.fetchval("SELECT md5(string_agg(id::text, ',' ORDER BY id)) FROM app.sessions")
        == kept
    )
    # the same period again (a retried trigger, a catch-up): nothing to run, nothing changes
    again = await CronService(pool, repo, settings.schedules).catch_up(
        schedule.name, PERIOD, PERIOD
    )
    assert [r.outcome for r in again] == ["existing"]
    assert await run_units(repo, effect, schedule.queue, f"{schedule.handler}:1") == 0


async def test_a_unit_resumes_after_the_recorded_cursor(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    """What an attempt after a crash sees: progress committed by the pages before. The rows
    at or below the cursor are not looked at again (here: an expired row planted below the
    cursor stays, which a restart from the beginning would have deleted)."""
    _, handler = example_handler(page_size=50)
    await repo.sync_registry({"maintenance": (5, 3600)}, {"expire_tenant_sessions": ("sql", 1)})
    await seed_sessions(pool, per_tenant=300)
    below = await pool.fetchval(
        "SELECT id FROM app.sessions WHERE tenant = 'acme' AND expires_at < $1 "
        "ORDER BY id OFFSET 99 LIMIT 1",
        PERIOD,
    )
    (result,) = await repo.enqueue_many(
        [
            NewJob(
                key="resume-acme",
                handler="expire_tenant_sessions",
                payload={"period_start": PERIOD.isoformat(), "tenant": "acme"},
                queue="maintenance",
                tenant="acme",
            )
        ]
    )
    await pool.execute(
        "UPDATE dispatcher.jobs SET progress = $2 WHERE id = $1",
        result.id,
        {"cursor": below, "pages": 2, "rows": 100},
    )
    effect = SqlEffect("expire_tenant_sessions", handler, repo, OWNER)
    assert await run_units(repo, effect, "maintenance", "expire_tenant_sessions:1") == 1
    job = await repo.get(result.id)
    assert job is not None and job["state"] == "succeeded"
    # 200 expired acme rows; 100 were "done" before: 100 more in 2 full pages + 1 empty page
    assert job["result"]["rows"] == 200 and job["result"]["pages"] == 5
    left = await pool.fetch(
        "SELECT id FROM app.sessions WHERE tenant = 'acme' AND expires_at < $1", PERIOD
    )
    assert len(left) == 100 and max(r["id"] for r in left) == below


async def test_a_uuid_cursor_pages_through_every_row_once(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    """uuid has no max() aggregate and this statement does not remove rows from its own
    candidate set: each row is touched exactly once only if every page starts after the last."""
    await pool.execute("""
        CREATE TABLE public.items (id uuid PRIMARY KEY, touched integer NOT NULL DEFAULT 0);
        INSERT INTO public.items (id) SELECT gen_random_uuid() FROM generate_series(1, 1234);
    """)
    handler = HandlerSettings(
        kind="sql",
        cursor="id",
        statement=(
            "UPDATE public.items SET touched = touched + 1 WHERE id IN "
            "(SELECT id FROM public.items WHERE ($1::uuid IS NULL OR id > $1::uuid) "
            "ORDER BY id LIMIT $2) RETURNING id"
        ),
        params=["cursor", "page_size"],
        page_size=100,
    )
    await repo.sync_registry({"default": (5, 3600)}, {"touch": ("sql", 1)})
    await repo.enqueue_many([NewJob(key="touch-all", handler="touch", payload={})])
    effect = SqlEffect("touch", handler, repo, OWNER)
    assert await run_units(repo, effect, "default", "touch:1") == 1
    touched = await pool.fetch("SELECT touched, count(*) AS n FROM public.items GROUP BY 1")
    assert {r["touched"]: r["n"] for r in touched} == {1: 1234}
    job = await repo.get_by_key("touch-all")
    assert job is not None
    last = await pool.fetchval("SELECT max(id::text) FROM public.items")
    assert job["result"] == {"cursor": last, "pages": 13, "rows": 1234}


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        # a statement whose cursor column is NULL would restart at the beginning for ever
        (
            "UPDATE public.rows SET n = n + 1 WHERE k IN (SELECT k FROM public.rows "
            "WHERE k > coalesce($1, '') ORDER BY k LIMIT $2) RETURNING NULL::text AS k",
            "no 'k' value",
        ),
        # a statement that ignores the cursor returns the same full page again
        (
            "SELECT k FROM public.rows WHERE $1::text IS NULL OR true ORDER BY k LIMIT $2",
            "ended at cursor 'r-0004' again",
        ),
        # no RETURNING (the load-time check was bypassed): refused when it is prepared
        (
            "UPDATE public.rows SET n = n + 1 WHERE k > coalesce($1, '') AND $2::int > 0",
            "must return its cursor column",
        ),
    ],
)
async def test_a_statement_that_cannot_page_is_refused_with_the_reason(
    pool: asyncpg.Pool, repo: JobRepository, statement: str, reason: str
) -> None:
    await pool.execute("""
        CREATE TABLE public.rows (k text PRIMARY KEY, n integer NOT NULL DEFAULT 0);
        INSERT INTO public.rows (k)
        SELECT 'r-' || lpad(g::text, 4, '0') FROM generate_series(0, 9) g;
    """)
    handler = HandlerSettings.model_construct(
        kind="sql", cursor="k", statement=statement, params=["cursor", "page_size"], page_size=5
    )
    await repo.sync_registry({"default": (5, 3600)}, {"pager": ("sql", 1)})
    await repo.enqueue_many([NewJob(key="pager", handler="pager", payload={})])
    effect = SqlEffect("pager", handler, repo, OWNER)
    (job,), _ = await repo.claim("default", 1, ["pager:1"], OWNER, 60)
    with pytest.raises(Reject, match=reason) as refused:
        async with repo.connection() as conn:
            await effect.run(job, completer(repo), conn)
    assert refused.value.code == "invalid_statement"


# configuration ------------------------------------------------------------------------------
GOOD = {
    "kind": "sql",
    "cursor": "id",
    "statement": "DELETE FROM t WHERE id IN (SELECT id FROM t WHERE id > coalesce($1, 0) "
    "ORDER BY id LIMIT $2) RETURNING id",
    "params": ["cursor", "page_size"],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {
                "statement": "DELETE FROM t WHERE id IN (SELECT id FROM t LIMIT $1) RETURNING id",
                "params": ["page_size"],
            },
            r"add \['cursor'\] to params",
        ),
        (
            {
                "statement": "DELETE FROM t WHERE id > coalesce($1, 0) RETURNING id",
                "params": ["cursor"],
            },
            r"add \['page_size'\] to params",
        ),
        (
            {
                "statement": "DELETE FROM t WHERE id IN (SELECT id FROM t WHERE id > "
                "coalesce($1, 0) ORDER BY id LIMIT $2)"
            },
            "end it with `RETURNING id`",
        ),
        (
            {
                "statement": "DELETE FROM t WHERE id IN (SELECT id FROM t WHERE id > "
                "coalesce($1, 0) ORDER BY id LIMIT $2) RETURNING user_id"
            },
            "end it with `RETURNING id`",
        ),
        ({"kind": "python", "function": "m:f"}, "cursor pages a sql handler"),
        ({"cursor": "Id; DROP"}, "String should match pattern"),
    ],
)
def test_a_cursor_handler_that_cannot_work_is_refused_at_load(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        HandlerSettings.model_validate({**GOOD, **change})


def test_a_cursor_handler_returning_every_column_is_accepted() -> None:
    star = GOOD["statement"].replace("RETURNING id", "RETURNING *")
    assert HandlerSettings.model_validate({**GOOD, "statement": star}).cursor == "id"
    assert load_settings(EXAMPLE, environ={}).handlers["expire_tenant_sessions"].cursor == "id"
