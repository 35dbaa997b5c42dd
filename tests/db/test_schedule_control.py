"""Operator control of schedules on real PostgreSQL, with the cron service's clock injected:
pause and resume (stored in the database, honoured by every instance, periods recorded as missed
with reason `paused` and never backfilled), dry runs of trigger and catch-up (nothing created),
and the run-finished follow-up (one job per finished run, whoever sweeps and however often)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from dispatcher.cron.expression import PeriodError
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.cron.service import CronService
from dispatcher.db.jobs import JobRepository
from dispatcher.db.runs import SchedulePaused
from dispatcher.observability import metrics

# the registry a daemon writes at start (the shared `registry` fixture registers it)
pytestmark = pytest.mark.registry(
    {"default": (10, 86_400), "reports": (3, 3600)}, {"noop": ("python", 1)}
)

OWNER = "control-test"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def make_schedule(name: str, **overrides: Any) -> ScheduleSettings:
    raw: dict[str, Any] = {"name": name, "cron": "0 * * * *", "handler": "noop"}
    raw.update({"misfire_grace_s": 60, **overrides})
    return ScheduleSettings.model_validate(raw)


def service(pool: asyncpg.Pool, repo: JobRepository, *schedules: ScheduleSettings) -> CronService:
    return CronService(pool, repo, list(schedules))


async def counts(pool: asyncpg.Pool) -> tuple[int, int, int]:
    """(runs, jobs, missed periods): what a dry run must leave alone."""
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM dispatcher.runs) AS runs, "
        "(SELECT count(*) FROM dispatcher.jobs) AS jobs, "
        "(SELECT count(*) FROM dispatcher.missed_periods) AS missed"
    )
    return row["runs"], row["jobs"], row["missed"]


async def missed_rows(pool: asyncpg.Pool, schedule: str) -> list[tuple[str, str]]:
    rows = await pool.fetch(
        "SELECT to_char(period_start AT TIME ZONE 'UTC', 'DD HH24:MI') AS at, reason "
        "FROM dispatcher.missed_periods WHERE schedule = $1 ORDER BY period_start",
        schedule,
    )
    return [(r["at"], r["reason"]) for r in rows]


def paused_gauge(schedule: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("dispatcher_schedule_paused", {"schedule": schedule})


# pause and resume ---------------------------------------------------------------------------
async def test_a_paused_schedule_fires_on_no_instance_and_its_periods_are_missed_as_paused(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("hourly")
    first, second = service(pool, registry, s), service(pool, registry, s)
    await first.run_once(now=utc(2025, 6, 1, 9, 30))
    view = await first.pause("hourly", now=utc(2025, 6, 1, 9, 40))
    assert (view["paused"], view["paused_at"], view["next_fire_at"]) == (
        True,
        "2025-06-01T09:40:00Z",
        None,
    )
    assert paused_gauge("hourly") == 1

    # the other instance fires at 10:00 and 11:00 (on time): nothing is created
    assert await second.fire("hourly", now=utc(2025, 6, 1, 10, 0, 1)) is None
    assert await second.fire("hourly", now=utc(2025, 6, 1, 11, 0, 1)) is None
    # and a third one, started while paused (a restart), neither
    third = service(pool, registry, s)
    assert await third.run_once(now=utc(2025, 6, 1, 11, 0, 2)) == {"hourly": None}
    assert await counts(pool) == (0, 0, 2)
    assert await missed_rows(pool, "hourly") == [("01 10:00", "paused"), ("01 11:00", "paused")]

    # pausing again changes nothing: the pause keeps its start
    again = await second.pause("hourly", now=utc(2025, 6, 1, 11, 5))
    assert again["paused_at"] == "2025-06-01T09:40:00Z"

    view = await second.resume("hourly", now=utc(2025, 6, 1, 11, 30))
    assert (view["paused"], view["paused_at"]) == (False, None)
    assert view["next_fire_at"] == "2025-06-01T12:00:00Z"
    assert view["missed"]["count"] == 2
    assert {m["reason"] for m in view["missed"]["periods"]} == {"paused"}
    assert view["missed"]["catch_up"] == (
        "dispatcher catch-up hourly --from 2025-06-01T10:00:00Z --to 2025-06-01T11:00:00Z"
    )
    assert paused_gauge("hourly") == 0
    # resumed on every instance: the next period fires, the paused ones were not backfilled
    fired = await first.fire("hourly", now=utc(2025, 6, 1, 12, 0, 1))
    assert fired is not None and fired.run_key == "hourly:2025-06-01T12:00:00Z"
    assert await counts(pool) == (1, 1, 2)
    resumed_again = await first.resume("hourly", now=utc(2025, 6, 1, 12, 0, 2))
    assert resumed_again["paused"] is False and await counts(pool) == (1, 1, 2)


async def test_resume_records_the_periods_passed_while_paused_before_anything_fires(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("nightly", cron="0 2 * * *", misfire_grace_s=3600)
    svc = service(pool, registry, s)
    await svc.run_once(now=utc(2025, 6, 1, 1, 0))
    await svc.pause("nightly", now=utc(2025, 6, 1, 1, 30))
    # no instance runs for three days; the operator resumes at 02:10 on the 4th, within the
    # grace of that night's period, which would otherwise fire late
    view = await svc.resume("nightly", now=utc(2025, 6, 4, 2, 10))
    assert await missed_rows(pool, "nightly") == [
        ("01 02:00", "paused"),
        ("02 02:00", "paused"),
        ("03 02:00", "paused"),
        ("04 02:00", "paused"),
    ]
    assert view["missed"]["count"] == 4
    assert await svc.run_once(now=utc(2025, 6, 4, 2, 11)) == {"nightly": None}
    assert (await counts(pool))[:2] == (0, 0)
    fired = await svc.fire("nightly", now=utc(2025, 6, 5, 2, 0, 1))
    assert fired is not None and fired.outcome == "created"


async def test_periods_before_the_pause_keep_their_own_reason(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("quarter", cron="*/15 * * * *", misfire_grace_s=300)
    svc = service(pool, registry, s)
    await svc.run_once(now=utc(2025, 6, 1, 9, 0, 1))
    # down from 09:00 to 09:50; paused at 09:40 (from the CLI); the daemon starts at 09:50:
    # 09:15 passed unfired before the pause, 09:45 after it
    await svc.pause("quarter", now=utc(2025, 6, 1, 9, 40))
    await svc.run_once(now=utc(2025, 6, 1, 9, 50))
    assert await missed_rows(pool, "quarter") == [
        ("01 09:15", "not_fired"),
        ("01 09:30", "not_fired"),
        ("01 09:45", "paused"),
    ]


async def test_a_cron_fire_after_the_pause_committed_creates_nothing_but_operators_still_can(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("guarded")
    svc = service(pool, registry, s)
    await svc.run_once(now=utc(2025, 6, 1, 9, 30))
    await svc.pause("guarded", now=utc(2025, 6, 1, 9, 45))
    # a fire that read the state before the pause reaches the trigger after it: the check
    # under the schedule's lock refuses it
    with pytest.raises(SchedulePaused):
        await svc.trigger("guarded", utc(2025, 6, 1, 10), via="cron")
    assert await counts(pool) == (0, 0, 0)
    # an explicit trigger and a catch-up are operator requests: they run while paused
    explicit = await svc.trigger("guarded", utc(2025, 6, 1, 10))
    caught = await svc.catch_up("guarded", utc(2025, 6, 1, 9), utc(2025, 6, 1, 9))
    assert (explicit.outcome, [r.outcome for r in caught]) == ("created", ["created"])
    assert explicit.via == "api" and caught[0].via == "catch_up"


async def test_pausing_an_unknown_schedule_is_refused(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    svc = service(pool, registry, make_schedule("known"))
    with pytest.raises(LookupError, match=r"no schedule 'other'.*known"):
        await svc.pause("other")
    with pytest.raises(LookupError):
        await svc.resume("other")
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.schedule_state") == 0


# dry runs -----------------------------------------------------------------------------------
async def test_dry_runs_list_what_would_be_created_and_create_nothing(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("dry", fanout={"ranges": 4})
    svc = CronService(pool, registry, [s], clock=lambda: utc(2025, 6, 1, 12, 30))
    await svc.run_once(now=utc(2025, 6, 1, 9, 30))
    await svc.run_once(now=utc(2025, 6, 1, 12, 30))  # 10:00, 11:00, 12:00 missed
    await svc.trigger("dry", utc(2025, 6, 1, 11))
    before = await counts(pool)

    planned = await svc.plan_catch_up("dry", utc(2025, 6, 1, 10), utc(2025, 6, 1, 12))
    assert [p.to_json() for p in planned] == [
        {
            "run_key": "dry:2025-06-01T10:00:00Z",
            "period_start": "2025-06-01T10:00:00Z",
            "outcome": "would_create",
            "units": 4,
        },
        {
            "run_key": "dry:2025-06-01T11:00:00Z",
            "period_start": "2025-06-01T11:00:00Z",
            "outcome": "existing",
            "units": None,
        },
        {
            "run_key": "dry:2025-06-01T12:00:00Z",
            "period_start": "2025-06-01T12:00:00Z",
            "outcome": "would_create",
            "units": 4,
        },
    ]
    one = await svc.plan_trigger("dry", utc(2025, 6, 1, 10))
    assert (one.outcome, one.units) == ("would_create", 4)
    assert (await svc.plan_trigger("dry", utc(2025, 6, 1, 11))).outcome == "existing"
    # refused exactly as the real thing would be
    with pytest.raises(PeriodError, match="future"):
        await svc.plan_catch_up("dry", utc(2025, 6, 1, 10), utc(2025, 6, 2, 10))
    with pytest.raises(PeriodError, match="not a period start"):
        await svc.plan_trigger("dry", utc(2025, 6, 1, 10, 30))
    assert await counts(pool) == before

    created = await svc.catch_up("dry", utc(2025, 6, 1, 10), utc(2025, 6, 1, 12))
    assert [r.outcome for r in created] == ["created", "existing", "created"]
    replanned = await svc.plan_catch_up("dry", utc(2025, 6, 1, 10), utc(2025, 6, 1, 12))
    assert {p.outcome for p in replanned} == {"existing"}


async def test_a_dry_run_of_a_query_fanout_does_not_run_the_query(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("queried", fanout={"sql": "SELECT name FROM public.no_such_table"})
    svc = service(pool, registry, s)
    planned = await svc.plan_trigger("queried", utc(2025, 6, 1, 10))
    assert (planned.outcome, planned.units) == ("would_create", None)


# run-finished follow-ups --------------------------------------------------------------------
FOLLOW = {"handler": "noop", "payload": {"channel": "ops"}, "queue": "reports"}


async def follow_ups(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT key, queue, state, payload, run_key FROM dispatcher.jobs "
        "WHERE key LIKE '%:finished' ORDER BY key"
    )


async def test_the_last_terminal_unit_yields_exactly_one_follow_up_with_the_counts(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("fan", fanout={"tenants": ["a", "b", "c", "d", "e", "f"]}, on_finished=FOLLOW)
    first, second = service(pool, registry, s), service(pool, registry, s)
    receipt = await first.trigger("fan", utc(2025, 6, 1, 10))
    units = {
        r["payload"]["unit"]: r["id"]
        for r in await pool.fetch(
            "SELECT id, payload FROM dispatcher.jobs WHERE run_key = $1", receipt.run_key
        )
    }
    await registry.cancel(units["e"])
    jobs, _ = await registry.claim("default", 10, ["noop:1"], OWNER, 30)
    by_unit = {j.payload["unit"]: j for j in jobs}
    done = [by_unit["a"], by_unit["b"]]
    await registry.complete([j.id for j in done], [j.attempt for j in done], [None, None], OWNER)
    for unit in ("c", "d"):
        await registry.record_failure(
            by_unit[unit], OWNER, permanent=True, delay_s=0, error="bad", reason="test"
        )
    await pool.execute(  # an operator discards one dead letter
        "UPDATE dispatcher.jobs SET state = 'discarded' WHERE id = $1", units["d"]
    )
    # unit f still runs: nothing is finished, no follow-up
    assert await first.finish_runs() == 0
    assert await follow_ups(pool) == []

    await registry.complete([by_unit["f"].id], [by_unit["f"].attempt], [None], OWNER)
    # every path that finishes runs, on two instances at once
    swept = await asyncio.gather(
        first.finish_runs(),
        second.finish_runs(),
        first.run_once(now=utc(2025, 6, 1, 10, 5)),
        second.status(now=utc(2025, 6, 1, 10, 5)),
        first.finish_runs(),
    )
    assert swept[0] + swept[1] + swept[4] <= 1
    (follow,) = await follow_ups(pool)
    assert follow["key"] == "fan:2025-06-01T10:00:00Z:finished"
    assert (follow["queue"], follow["state"], follow["run_key"]) == ("reports", "ready", None)
    assert follow["payload"] == {
        "channel": "ops",
        "schedule": "fan",
        "period_start": "2025-06-01T10:00:00Z",
        "run_key": "fan:2025-06-01T10:00:00Z",
        "units": 6,
        "succeeded": 3,
        "dead": 1,
        "discarded": 1,
        "cancelled": 1,
    }
    # the follow-up is not a unit of the run it reports on
    (view,) = await first.status(now=utc(2025, 6, 1, 10, 6))
    assert view["last_run"]["units"] == {
        "total": 6,
        "succeeded": 3,
        "dead": 1,
        "cancelled": 1,
        "discarded": 1,
        "pending": 0,
    }
    assert view["last_run"]["finished_at"] is not None
    snapshot = await pool.fetchrow(
        "SELECT succeeded, dead, cancelled, discarded FROM dispatcher.runs WHERE run_key = $1",
        receipt.run_key,
    )
    assert dict(snapshot) == {"succeeded": 3, "dead": 1, "cancelled": 1, "discarded": 1}
    # later sweeps, and an operator retrying a unit of the finished run, add nothing
    await registry.retry(units["c"])
    for svc in (first, second):
        assert await svc.finish_runs() == 0
        await svc.run_once(now=utc(2025, 6, 1, 10, 10))
    assert len(await follow_ups(pool)) == 1


async def test_a_run_without_units_gets_its_follow_up_at_once_and_a_skipped_run_none(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    await pool.execute("CREATE TABLE public.tenants (name text NOT NULL)")
    empty = make_schedule(
        "empty", fanout={"sql": "SELECT name FROM public.tenants"}, on_finished=FOLLOW
    )
    svc = service(pool, registry, empty)
    receipt = await svc.trigger("empty", utc(2025, 6, 1, 10), via="cron")
    assert (receipt.unit_count, receipt.finished_at is not None) == (0, True)
    (follow,) = await follow_ups(pool)
    assert follow["payload"]["units"] == 0 and follow["payload"]["succeeded"] == 0

    skipping = make_schedule(
        "skipping", fanout={"tenants": ["a"]}, overlap="skip", on_finished=FOLLOW
    )
    svc = service(pool, registry, skipping)
    await svc.trigger("skipping", utc(2025, 6, 1, 10), via="cron")
    skipped = await svc.trigger("skipping", utc(2025, 6, 1, 11), via="cron")
    assert skipped.overlap_decision == "skipped"
    await svc.finish_runs()
    assert [r["key"] for r in await follow_ups(pool)] == ["empty:2025-06-01T10:00:00Z:finished"]


async def test_a_unit_named_like_the_follow_up_is_refused(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    await pool.execute("CREATE TABLE public.units (name text NOT NULL)")
    await pool.execute("INSERT INTO public.units VALUES ('a'), ('finished')")
    s = make_schedule("clash", fanout={"sql": "SELECT name FROM public.units"}, on_finished=FOLLOW)
    with pytest.raises(PeriodError, match=r"'finished'.*reserved for the on_finished follow-up"):
        await service(pool, registry, s).trigger("clash", utc(2025, 6, 1, 10))
    assert await counts(pool) == (0, 0, 0)
    # without on_finished the name is free
    free = make_schedule("free", fanout={"sql": "SELECT name FROM public.units"})
    assert (
        await service(pool, registry, free).trigger("free", utc(2025, 6, 1, 10))
    ).unit_count == 2


async def test_the_finish_sweep_probes_the_unfinished_units_by_index(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    """A run of 20,000 units with one still running: the sweep's probe must not walk the
    finished ones (it runs every second while the run lasts)."""
    run = "big:2025-06-01T10:00:00Z"
    n = 20_000
    await pool.execute(
        "INSERT INTO dispatcher.runs (run_key, schedule, period_start, via, unit_count, "
        "overlap_decision, released_at) VALUES ($1, 'big', $2, 'cron', $3, 'none', now())",
        run,
        utc(2025, 6, 1, 10),
        n,
    )
    await pool.execute(
        "SELECT count(*) FROM dispatcher.enqueue_many("
        "(SELECT array_agg($1 || ':' || g) FROM generate_series(1, $2) g),"
        " array_fill('noop'::text, ARRAY[$2]), array_fill('{}'::jsonb, ARRAY[$2]),"
        " array_fill(now(), ARRAY[$2]), array_fill('default'::text, ARRAY[$2]),"
        " array_fill(NULL::text, ARRAY[$2]), array_fill(NULL::jsonb, ARRAY[$2]),"
        " array_fill(NULL::integer, ARRAY[$2]), array_fill(NULL::integer, ARRAY[$2]),"
        " array_fill($1::text, ARRAY[$2]))",
        run,
        n,
    )
    # every unit but the last finished, and autovacuum has not been by yet
    await pool.execute(
        "UPDATE dispatcher.jobs SET state = 'succeeded', finished_at = now() WHERE key <> $1",
        f"{run}:{n}",
    )
    await pool.execute("ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.runs")
    from dispatcher.db.queries import query

    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            rows = await conn.fetch("EXPLAIN (ANALYZE) " + query("finish_runs"), "big")
        finally:
            await tx.rollback()
    plan = "\n".join(r[0] for r in rows)
    assert "jobs_run_unfinished" in plan, plan
    # The probe runs first, as its own step: left to inline it, the planner sometimes (it
    # depends on the sampled statistics) joined and sorted every unit of the run before
    # probing, 118 ms for 100,000 units instead of one probe.
    assert "CTE done" in plan, plan
    # no step of the plan handles more than a handful of rows (inlined, the planner joined all
    # 20,000 units before probing)
    # (PostgreSQL 18 prints average rows per loop with decimals, 15 as whole numbers)
    handled = [
        float(rows) * int(loops)
        for rows, loops in re.findall(r"actual time=\S+ rows=([\d.]+) loops=(\d+)", plan)
    ]
    assert handled and max(handled) < 100, plan
    assert await service(pool, registry, make_schedule("big")).finish_runs() == 0
    assert await pool.fetchval("SELECT finished_at FROM dispatcher.runs") is None


# config -------------------------------------------------------------------------------------
def test_on_finished_is_checked_when_the_schedule_is_loaded() -> None:
    with pytest.raises(ValueError, match="tenant 'finished' would share its key"):
        make_schedule("t", fanout={"tenants": ["a", "finished"]}, on_finished=FOLLOW)
    with pytest.raises(ValueError, match=r"may not set \['dead', 'units'\]"):
        make_schedule("t", on_finished={"handler": "noop", "payload": {"units": 1, "dead": 2}})
    with pytest.raises(ValueError, match='"http" needs target'):
        make_schedule("t", on_finished={"handler": "http"})
    with pytest.raises(ValueError, match="takes no target"):
        make_schedule("t", on_finished={"handler": "noop", "target": {"url": "https://x"}})
    with pytest.raises(ValueError, match=r"unknown|Extra inputs"):
        make_schedule("t", on_finished={"handler": "noop", "delay_s": 5})
    assert make_schedule("t", on_finished=FOLLOW).on_finished is not None


def test_the_follow_up_key_is_one_past_the_run_key() -> None:
    s = make_schedule("keys", on_finished=FOLLOW)
    job = s.follow_up_job("keys:2025-06-01T10:00:00Z", utc(2025, 6, 1, 10), 2, {"succeeded": 2})
    assert job is not None and job.key == "keys:2025-06-01T10:00:00Z:finished"
    assert (job.queue, job.run_key, job.payload["dead"]) == ("reports", None, 0)
    assert make_schedule("none").follow_up_job("none:x", utc(2025, 6, 1), 0, {}) is None
