"""Cron triggers and catch-ups with periods far out of range are refused with a PeriodError (a
422 over HTTP, a message from the CLI), never an OverflowError, and create nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest

from dispatcher.cron.expression import PeriodError
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.cron.service import CronService
from dispatcher.db.jobs import JobRepository

PLUS_14 = timezone(timedelta(hours=14))


def schedule(name: str, cron: str, zone: str = "UTC") -> ScheduleSettings:
    return ScheduleSettings.model_validate(
        {"name": name, "cron": cron, "handler": "noop", "timezone": zone, "misfire_grace_s": 60}
    )


@pytest.fixture
async def svc(pool: asyncpg.Pool, repo: JobRepository) -> CronService:
    await repo.sync_registry({"default": (10, 86_400)}, {"noop": ("python", 1)})
    return CronService(
        pool,
        repo,
        [schedule("yearly", "0 0 1 1 *"), schedule("east", "0 0 * * *", "Pacific/Kiritimati")],
    )


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (datetime(1, 1, 1, tzinfo=UTC), datetime(2, 1, 1, tzinfo=UTC), "before 2000-01-01"),
        (datetime(1, 1, 1, tzinfo=PLUS_14), datetime(2, 1, 1, tzinfo=UTC), "out of range"),
        (datetime(1990, 1, 1, tzinfo=UTC), datetime(1992, 1, 1, tzinfo=UTC), "before 2000-01-01"),
        (datetime(2024, 1, 1, tzinfo=UTC), datetime.max.replace(tzinfo=UTC), "in the future"),
    ],
)
async def test_catch_up_far_out_of_range_is_refused(
    svc: CronService, pool: asyncpg.Pool, start: datetime, end: datetime, message: str
) -> None:
    with pytest.raises(PeriodError, match=message):
        await svc.catch_up("yearly", start, end)
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.runs") == 0


@pytest.mark.parametrize(
    "period",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=PLUS_14),
        datetime(1999, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, tzinfo=UTC),
        datetime.max.replace(tzinfo=UTC),
    ],
)
@pytest.mark.parametrize("name", ["yearly", "east"])
async def test_trigger_far_out_of_range_is_refused(
    svc: CronService, pool: asyncpg.Pool, name: str, period: datetime
) -> None:
    with pytest.raises(PeriodError):
        await svc.trigger(name, period)
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.runs") == 0


async def test_the_first_accepted_period_can_be_caught_up(svc: CronService) -> None:
    receipts = await svc.catch_up(
        "yearly", datetime(2000, 1, 1, tzinfo=UTC), datetime(2001, 6, 1, tzinfo=UTC)
    )
    assert [r.run_key for r in receipts] == [
        "yearly:2000-01-01T00:00:00Z",
        "yearly:2001-01-01T00:00:00Z",
    ]
