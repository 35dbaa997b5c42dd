"""Cron runs on real PostgreSQL: one run per period however many instances fire, a failed
trigger converges on retry, missed periods are reported and caught up explicitly, overlap
policies are recorded on the receipt, and the operator view adds up."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from dispatcher.cron.expression import PeriodError, run_key
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.cron.service import CronService, UnknownSchedule
from dispatcher.db.jobs import JobRepository
from dispatcher.db.runs import TriggerFailed
from dispatcher.model import NewJob
from dispatcher.observability import metrics
from dispatcher.runtime.timing import TimingEngine
from tests.harness import wait_until

# the registry a daemon writes at start (the shared `registry` fixture registers it)
pytestmark = pytest.mark.registry({"default": (10, 86_400)}, {"noop": ("python", 1)})

OWNER = "test-worker"
MINUTE = timedelta(minutes=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def make_schedule(name: str, **overrides: Any) -> ScheduleSettings:
    raw: dict[str, Any] = {
        "name": name,
        "cron": "0 * * * *",
        "handler": "noop",
        "misfire_grace_s": 60,
    }
    raw.update(overrides)
    return ScheduleSettings.model_validate(raw)


def service(
    pool: asyncpg.Pool, repo: JobRepository, *schedules: ScheduleSettings, **kwargs: Any
) -> CronService:
    return CronService(pool, repo, list(schedules), **kwargs)


async def scalar(pool: asyncpg.Pool, sql: str, *args: Any) -> Any:
    return await pool.fetchval(sql, *args)


async def unit_count(pool: asyncpg.Pool, schedule: str) -> int:
    return await scalar(
        pool, "SELECT count(*) FROM dispatcher.jobs WHERE run_key LIKE $1 || ':%'", schedule
    )


async def run_count(pool: asyncpg.Pool, schedule: str) -> int:
    return await scalar(pool, "SELECT count(*) FROM dispatcher.runs WHERE schedule = $1", schedule)


async def finish_units(repo: JobRepository, *, dead: int = 0, limit: int = 1000) -> int:
    """Play the worker: claim ready units, let `dead` of them fail permanently, the rest succeed."""
    jobs, _ = await repo.claim("default", limit, ["noop:1"], OWNER, 30)
    for job in jobs[:dead]:
        await repo.record_failure(job, OWNER, permanent=True, delay_s=0, error="bad", reason="test")
    rest = jobs[dead:]
    await repo.complete([j.id for j in rest], [j.attempt for j in rest], [None] * len(rest), OWNER)
    return len(jobs)


def missed_metric(schedule: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "dispatcher_cron_missed_periods_total", {"schedule": schedule}
    )
    return value or 0.0


# one period, one run ------------------------------------------------------------------------
async def test_two_instances_firing_the_same_period_yield_one_run(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule(
        "fanout",
        cron="0 2 * * *",
        timezone="Europe/Berlin",
        fanout={"ranges": 240, "key_space": [0, 2400]},
    )
    period = utc(2026, 5, 31, 0, 0)  # 02:00 CEST
    first, second = service(pool, registry, s), service(pool, registry, s)
    await first.run_once(now=period - timedelta(hours=1))  # both daemons were up before 02:00
    await second.run_once(now=period - timedelta(minutes=30))

    fired = await asyncio.gather(
        first.fire("fanout", now=period + timedelta(seconds=1)),
        second.fire("fanout", now=period + timedelta(seconds=2)),
    )
    receipts = [r for r in fired if r is not None]
    assert [r.outcome for r in receipts].count("created") == 1
    # any further fire of the same period (retried trigger, catch-up, API) converges
    again = await asyncio.gather(
        *(
            svc.trigger("fanout", period, via=via)
            for svc in (first, second)
            for via in ("cron", "api", "catch_up")
        )
    )
    assert {r.outcome for r in again} == {"existing"}
    assert {r.run_key for r in again} == {"fanout:2026-05-31T00:00:00Z"}
    assert await run_count(pool, "fanout") == 1
    assert await unit_count(pool, "fanout") == 240
    keys = await pool.fetch("SELECT key FROM dispatcher.jobs ORDER BY key")
    assert keys[0]["key"] == "fanout:2026-05-31T00:00:00Z:r000-of-240"


async def test_two_started_daemons_both_firing_on_the_timing_engine_yield_one_run(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("every-minute", cron="* * * * *", fanout={"tenants": ["a", "b", "c"]})
    period = utc(2026, 6, 1, 12, 0)
    clock = [period - timedelta(seconds=30)]
    engines = [TimingEngine(), TimingEngine()]
    daemons = [service(pool, registry, s, clock=lambda: clock[0], timing=t) for t in engines]
    job = daemons[0].job_name("every-minute")
    for engine, daemon in zip(engines, daemons, strict=True):
        await engine.start()
        await daemon.start()
    try:
        # each engine waits for the schedule's next period start (by the real clock)
        now = datetime.now(UTC)
        expected = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
        assert [e.next_run(job) for e in engines] in ([expected] * 2, [expected - MINUTE] * 2)
        # the period has come (for the services' clock); make both engines fire now
        clock[0] = period + timedelta(seconds=2)
        for engine in engines:
            engine.run_now(job)
        await wait_until(lambda: all(e.calls(job) == 1 for e in engines), timeout_s=20)
        assert await run_count(pool, "every-minute") == 1
        assert await unit_count(pool, "every-minute") == 3
        receipt = (await daemons[0].status())[0]["last_run"]
        assert receipt["run_key"] == "every-minute:2026-06-01T12:00:00Z"
        assert receipt["via"] == "cron"
        # each fire armed the next period on its engine
        assert all((e.next_run(job) or now) > now for e in engines)
    finally:
        for engine, daemon in zip(engines, daemons, strict=True):
            await daemon.stop()
            await daemon.stop()  # idempotent
            await engine.stop()
    assert all(e.next_run(job) is None for e in engines)


# the seed scenario: 137 of 240, then the connection drops ------------------------------------
async def test_trigger_failing_after_137_of_240_units_converges_on_240(
    pool: asyncpg.Pool, registry: JobRepository, db_url: str
) -> None:
    s = make_schedule("ranges", cron="0 2 * * *", fanout={"ranges": 240, "key_space": [0, 2400]})
    period = utc(2026, 5, 31, 2, 0)
    armed = [True]
    written: list[int] = []

    async def drop_connection(units_written: int) -> None:
        written.append(units_written)
        if armed[0] and units_written == 137:
            armed[0] = False
            killer = await asyncpg.connect(db_url)
            try:
                killed = await killer.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND state = 'idle in transaction' "
                    "AND pid <> pg_backend_pid()"
                )
            finally:
                await killer.close()
            assert killed == 1

    svc = service(pool, registry, s, unit_batch=137, after_unit_batch=drop_connection)
    with pytest.raises(TriggerFailed, match="rolled back, safe to retry"):
        await svc.trigger("ranges", period, via="cron")
    assert written == [137]  # the connection dropped after 137 units were written
    assert await run_count(pool, "ranges") == 0  # and nothing of them survived
    assert await unit_count(pool, "ranges") == 0

    retried = await svc.trigger("ranges", period, via="cron")
    assert (retried.outcome, retried.unit_count) == ("created", 240)
    assert written == [137, 137, 240]
    again = await svc.trigger("ranges", period, via="cron")
    assert again.outcome == "existing"
    assert await unit_count(pool, "ranges") == 240  # never 377
    assert await scalar(pool, "SELECT count(DISTINCT key) FROM dispatcher.jobs") == 240


async def test_units_published_before_a_lost_trigger_converge_with_its_retry(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    # Units that did get through (an earlier non-transactional publisher, or the SQL door with
    # the same keys) are found by key, not duplicated.
    s = make_schedule("ranges", cron="0 2 * * *", fanout={"ranges": 240, "key_space": [0, 2400]})
    period = utc(2026, 5, 31, 2, 0)
    survivors = s.jobs_for(period, s.static_units() or [])[:137]
    results = await registry.enqueue_many(survivors)
    assert {r.outcome for r in results} == {"created"}

    receipt = await service(pool, registry, s).trigger("ranges", period, via="cron")
    assert (receipt.outcome, receipt.unit_count, receipt.pending) == ("created", 240, 240)
    assert await unit_count(pool, "ranges") == 240


async def test_conflicting_unit_rolls_the_whole_run_back(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("ranges", fanout={"ranges": 4, "key_space": [0, 40]})
    period = utc(2026, 5, 31, 2, 0)
    squatter = s.jobs_for(period, s.static_units() or [])[2]
    await registry.enqueue_many([NewJob(key=squatter.key, handler="noop", payload={"other": 1})])
    with pytest.raises(TriggerFailed, match="different request"):
        await service(pool, registry, s).trigger("ranges", period)
    assert await run_count(pool, "ranges") == 0
    assert await unit_count(pool, "ranges") == 0


# missed periods and catch-up ----------------------------------------------------------------
async def test_missed_periods_are_reported_and_caught_up_exactly_once(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("hourly-missed")
    svc = service(pool, registry, s)
    start = utc(2025, 6, 1, 9, 30)
    assert await svc.run_once(now=start) == {"hourly-missed": None}
    before = missed_metric("hourly-missed")
    # no dispatcher ran from 09:30 to 12:30: 10:00, 11:00 and 12:00 passed unfired
    assert await svc.run_once(now=start + timedelta(hours=3)) == {"hourly-missed": None}
    assert await run_count(pool, "hourly-missed") == 0  # not backfilled silently
    assert missed_metric("hourly-missed") - before == 3
    await svc.run_once(now=start + timedelta(hours=3, minutes=1))  # reported once, not again
    assert missed_metric("hourly-missed") - before == 3

    (view,) = await svc.status(now=start + timedelta(hours=3))
    assert view["missed"]["count"] == 3
    assert [m["period_start"] for m in view["missed"]["periods"]] == [
        "2025-06-01T12:00:00Z",
        "2025-06-01T11:00:00Z",
        "2025-06-01T10:00:00Z",
    ]
    assert {m["reason"] for m in view["missed"]["periods"]} == {"not_fired"}
    assert view["missed"]["catch_up"] == (
        "dispatcher catch-up hourly-missed --from 2025-06-01T10:00:00Z --to 2025-06-01T12:00:00Z"
    )
    assert view["next_fire_at"] == "2025-06-01T13:00:00Z"

    receipts = await svc.catch_up("hourly-missed", utc(2025, 6, 1, 10), utc(2025, 6, 1, 12))
    assert [r.outcome for r in receipts] == ["created"] * 3
    assert {r.via for r in receipts} == {"catch_up"}
    # the default overlap policy (skip) queues explicit periods behind the unfinished earlier one
    assert [r.overlap_decision for r in receipts] == ["none", "queued", "queued"]
    assert await run_count(pool, "hourly-missed") == 3
    assert await unit_count(pool, "hourly-missed") == 1

    rerun = await svc.catch_up("hourly-missed", utc(2025, 6, 1, 10), utc(2025, 6, 1, 12))
    assert [r.outcome for r in rerun] == ["existing"] * 3
    assert await run_count(pool, "hourly-missed") == 3
    assert await unit_count(pool, "hourly-missed") == 1
    while await finish_units(registry):  # workers drain; the queued runs follow one by one
        await svc.run_once(now=start + timedelta(hours=3, minutes=2))
    assert await unit_count(pool, "hourly-missed") == 3
    assert await run_count(pool, "hourly-missed") == 3
    (view,) = await svc.status(now=start + timedelta(hours=3))
    assert view["missed"] == {"count": 0, "periods": [], "catch_up": None}


async def test_late_fire_within_grace_runs_and_older_periods_are_missed(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("ten-minutes", cron="*/10 * * * *", misfire_grace_s=1200)
    svc = service(pool, registry, s)
    await svc.run_once(now=utc(2025, 6, 1, 10, 1))
    # down from 10:01 to 10:33 with 20 minutes of grace: 10:30 (3 minutes late) fires now,
    # 10:20 was within grace too but only the latest fires (coalesced), 10:10 is beyond grace
    fired = await svc.fire("ten-minutes", now=utc(2025, 6, 1, 10, 33))
    assert fired is not None and fired.run_key == "ten-minutes:2025-06-01T10:30:00Z"
    assert fired.via == "cron" and fired.outcome == "created"
    # down again from 10:33 to 11:05: 11:00 fires, 10:50 is coalesced, 10:40 beyond grace
    fired = await svc.fire("ten-minutes", now=utc(2025, 6, 1, 11, 5))
    assert fired is not None and fired.run_key == "ten-minutes:2025-06-01T11:00:00Z"
    rows = await pool.fetch(
        "SELECT to_char(period_start AT TIME ZONE 'UTC', 'HH24:MI') AS at, reason "
        "FROM dispatcher.missed_periods ORDER BY period_start"
    )
    assert [(r["at"], r["reason"]) for r in rows] == [
        ("10:10", "not_fired"),
        ("10:20", "coalesced"),
        ("10:40", "not_fired"),
        ("10:50", "coalesced"),
    ]
    assert await run_count(pool, "ten-minutes") == 2


async def test_periods_passed_while_disabled_are_reported_not_backfilled(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    paused = make_schedule("paused", enabled=False)
    svc = service(pool, registry, paused)
    await svc.run_once(now=utc(2025, 6, 1, 9, 30))
    await svc.run_once(now=utc(2025, 6, 1, 11, 30))
    (view,) = await svc.status(now=utc(2025, 6, 1, 12, 30))
    assert view["enabled"] is False and view["next_fire_at"] is None
    # 10:00 and 11:00 recorded, 12:00 not yet looked at by an accounting pass but reported
    assert view["missed"]["count"] == 3
    assert {m["reason"] for m in view["missed"]["periods"]} == {"disabled"}

    # re-enabled and restarted 10 s after 12:00: 12:00 passed while disabled, so it stays missed
    resumed = service(pool, registry, make_schedule("paused", enabled=True))
    assert await resumed.run_once(now=utc(2025, 6, 1, 12, 0, 10)) == {"paused": None}
    assert await run_count(pool, "paused") == 0
    fired = await resumed.fire("paused", now=utc(2025, 6, 1, 13, 0, 1))
    assert fired is not None and fired.run_key == "paused:2025-06-01T13:00:00Z"
    (view,) = await resumed.status(now=utc(2025, 6, 1, 13, 0, 2))
    assert view["missed"]["count"] == 3
    assert view["last_run"]["run_key"] == "paused:2025-06-01T13:00:00Z"


async def test_catch_up_across_a_dst_change_creates_one_run_per_local_day(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule("berlin", cron="30 2 * * *", timezone="Europe/Berlin")
    svc = service(pool, registry, s)
    spring = await svc.catch_up("berlin", utc(2026, 3, 28), utc(2026, 3, 30, 23))
    fall = await svc.catch_up("berlin", utc(2026, 10, 24), utc(2026, 10, 26, 23))
    assert [r.run_key for r in spring + fall] == [
        "berlin:2026-03-28T01:30:00Z",
        "berlin:2026-03-29T01:30:00Z",
        "berlin:2026-03-30T00:30:00Z",
        "berlin:2026-10-24T00:30:00Z",
        "berlin:2026-10-25T00:30:00Z",
        "berlin:2026-10-26T01:30:00Z",
    ]


async def test_refused_triggers_say_why(pool: asyncpg.Pool, registry: JobRepository) -> None:
    svc = service(pool, registry, make_schedule("hourly", timezone="Europe/Berlin"))
    with pytest.raises(
        PeriodError,
        match=r"not a period start .* nearest: 2025-06-01T10:00:00Z and 2025-06-01T11:00:00Z",
    ):
        await svc.trigger("hourly", utc(2025, 6, 1, 10, 30))
    with pytest.raises(PeriodError, match="in the future"):
        await svc.trigger(
            "hourly",
            datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=2),
        )
    with pytest.raises(PeriodError, match="UTC offset"):
        await svc.trigger("hourly", datetime(2025, 6, 1, 10))
    with pytest.raises(UnknownSchedule, match="known: hourly"):
        await svc.trigger("nightly", utc(2025, 6, 1, 10))
    with pytest.raises(PeriodError, match="ends in the future"):
        await svc.catch_up("hourly", utc(2025, 6, 1), datetime.now(UTC) + timedelta(days=1))
    with pytest.raises(PeriodError, match="more than 1000 periods"):
        await svc.catch_up("hourly", utc(2024, 1, 1), utc(2025, 1, 1))
    with pytest.raises(PeriodError, match="before it starts"):
        await svc.catch_up("hourly", utc(2025, 1, 2), utc(2025, 1, 1))
    assert await run_count(pool, "hourly") == 0


# fan-out by query ---------------------------------------------------------------------------
async def test_query_fanout_lists_units_inside_the_trigger(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    await pool.execute("CREATE TABLE public.tenants (name text NOT NULL, active boolean)")
    await pool.execute(
        "INSERT INTO public.tenants VALUES ('p-1', true), ('p-2', true), ('p-3', false)"
    )
    s = make_schedule(
        "per-tenant", fanout={"sql": "SELECT name FROM public.tenants WHERE active ORDER BY 1"}
    )
    receipt = await service(pool, registry, s).trigger("per-tenant", utc(2025, 6, 1, 10))
    assert receipt.unit_count == 2
    rows = await pool.fetch("SELECT key, payload FROM dispatcher.jobs ORDER BY key")
    assert [r["key"] for r in rows] == [
        "per-tenant:2025-06-01T10:00:00Z:p-1",
        "per-tenant:2025-06-01T10:00:00Z:p-2",
    ]
    assert rows[0]["payload"]["unit"] == "p-1"

    broken = make_schedule("broken", fanout={"sql": "SELECT name FROM public.no_such_table"})
    with pytest.raises(TriggerFailed, match="no_such_table"):
        await service(pool, registry, broken).trigger("broken", utc(2025, 6, 1, 10))
    assert await run_count(pool, "broken") == 0


# overlap policies ---------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["skip", "allow", "queue"])
async def test_overlap_policy_is_followed_and_recorded(
    pool: asyncpg.Pool, registry: JobRepository, policy: str
) -> None:
    s = make_schedule("sweep", overlap=policy, fanout={"tenants": ["a", "b", "c"]})
    svc = service(pool, registry, s)
    first = await svc.trigger("sweep", utc(2025, 6, 1, 10), via="cron")
    assert (first.overlap_decision, first.unit_count) == ("none", 3)

    second = await svc.trigger("sweep", utc(2025, 6, 1, 11), via="cron")
    assert second.overlap_with == first.run_key
    again = await svc.trigger("sweep", utc(2025, 6, 1, 11), via="cron")
    assert (again.outcome, again.overlap_decision) == ("existing", second.overlap_decision)
    second_units = "SELECT count(*) FROM dispatcher.jobs WHERE run_key = $1"
    if policy == "skip":
        assert (second.overlap_decision, second.unit_count) == ("skipped", 0)
        assert second.finished_at is not None
        assert await scalar(pool, second_units, second.run_key) == 0
    elif policy == "allow":
        assert (second.overlap_decision, second.unit_count) == ("allowed", 3)
        assert await scalar(pool, second_units, second.run_key) == 3
    else:
        assert (second.overlap_decision, second.unit_count, second.pending) == ("queued", 3, 3)
        assert second.released_at is None
        assert await scalar(pool, second_units, second.run_key) == 0
        await svc.run_once(now=utc(2025, 6, 1, 11, 0, 5))
        assert await scalar(pool, second_units, second.run_key) == 0  # first still running
        assert await finish_units(registry) == 3  # the first run's units finish
        await svc.run_once(now=utc(2025, 6, 1, 11, 0, 10))
        assert await scalar(pool, second_units, second.run_key) == 3  # released
        (view,) = await svc.status(now=utc(2025, 6, 1, 11, 1))
        assert view["last_run"]["released_at"] is not None
        assert view["last_run"]["units"]["pending"] == 3 and view["queued_runs"] == 0


async def test_explicit_trigger_under_skip_queues_instead_of_skipping(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    svc = service(pool, registry, make_schedule("sweep", fanout={"tenants": ["a", "b"]}))
    await svc.trigger("sweep", utc(2025, 6, 1, 10), via="cron")
    explicit = await svc.trigger("sweep", utc(2025, 6, 1, 9), via="api")  # an older period
    assert explicit.overlap_decision == "none"  # nothing earlier is unfinished
    caught = await svc.catch_up("sweep", utc(2025, 6, 1, 11), utc(2025, 6, 1, 12))
    assert [r.overlap_decision for r in caught] == ["queued", "queued"]
    assert await unit_count(pool, "sweep") == 4
    while await finish_units(registry):  # the worker drains; queued runs follow in order
        await svc.run_once(now=utc(2025, 6, 1, 12, 0, 5))
    assert await unit_count(pool, "sweep") == 8
    finished = await pool.fetch(
        "SELECT finished_at FROM dispatcher.runs WHERE schedule = 'sweep' ORDER BY period_start"
    )
    assert len(finished) == 4 and all(r["finished_at"] is not None for r in finished)


# operator view ------------------------------------------------------------------------------
async def test_status_shows_next_fire_last_receipt_and_unit_counts(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    s = make_schedule(
        "digest",
        cron="0 8 * * mon",
        timezone="America/New_York",
        fanout={"tenants": ["a", "b", "c"]},
    )
    svc = service(pool, registry, s, on_enqueued=lambda: woken.append(1))
    woken: list[int] = []
    (view,) = await svc.status(now=utc(2025, 6, 4))
    assert view["last_run"] is None and view["next_fire_at"] == "2025-06-09T12:00:00Z"

    receipt = await svc.trigger("digest", utc(2025, 6, 2, 12))  # Monday 08:00 EDT
    assert woken == [1]
    assert await finish_units(registry, dead=1, limit=2) == 2  # one succeeded, one dead
    (view,) = await svc.status(now=utc(2025, 6, 4))
    json.dumps(view)  # GET /v1/schedules serves exactly this
    assert view["last_run"]["run_key"] == receipt.run_key == run_key("digest", utc(2025, 6, 2, 12))
    assert view["last_run"]["units"] == {
        "total": 3,
        "succeeded": 1,
        "dead": 1,
        "cancelled": 0,
        "discarded": 0,
        "pending": 1,
    }
    assert view["last_run"]["finished_at"] is None
    assert view["fanout"] == {"kind": "tenants", "units": 3}

    assert await finish_units(registry) == 1
    (view,) = await svc.status(now=utc(2025, 6, 4))
    assert view["last_run"]["finished_at"] is not None
    assert view["last_run"]["units"]["pending"] == 0
    snapshot = await pool.fetchrow("SELECT succeeded, dead, cancelled FROM dispatcher.runs")
    assert tuple(snapshot) == (2, 1, 0)


async def test_failed_fire_is_retried_by_the_next_tick_within_grace(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    failures = [1]

    async def flaky(units_written: int) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError("connection reset by peer")

    s = make_schedule("flaky", fanout={"tenants": ["a", "b"]}, misfire_grace_s=300)
    svc = service(pool, registry, s, after_unit_batch=flaky)
    await svc.run_once(now=utc(2025, 6, 1, 9, 59))
    with pytest.raises(TriggerFailed, match="connection reset"):
        await svc.fire("flaky", now=utc(2025, 6, 1, 10, 0, 1))
    assert await run_count(pool, "flaky") == 0
    fired = await svc.run_once(now=utc(2025, 6, 1, 10, 0, 31))  # the housekeeping tick
    assert fired["flaky"] is not None and fired["flaky"].run_key == "flaky:2025-06-01T10:00:00Z"
    assert await unit_count(pool, "flaky") == 2
    assert await scalar(pool, "SELECT count(*) FROM dispatcher.missed_periods") == 0


async def test_a_long_outage_is_summarised_not_enumerated_forever(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    svc = service(pool, registry, make_schedule("minutely", cron="* * * * *"))
    await svc.run_once(now=utc(2025, 6, 1))
    before = missed_metric("minutely")
    started = time.monotonic()
    await svc.run_once(now=utc(2025, 6, 21))  # 20 days = 28,800 periods
    assert time.monotonic() - started < 30
    assert missed_metric("minutely") - before == 10_000  # the newest 10,000 are recorded
    (view,) = await svc.status(now=utc(2025, 6, 21))
    assert view["missed"]["count"] == 10_000
    assert view["missed"]["periods"][0]["period_start"] == "2025-06-20T23:59:00Z"
