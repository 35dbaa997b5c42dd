"""A schedule's `priority` and `concurrency_key` (migration 023): every unit of a run and its
on_finished follow-up carry them, and a bad value refuses the configuration, naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from pydantic import ValidationError

from dispatcher.cron.service import CronService
from dispatcher.db.jobs import JobRepository
from tests.db.test_cron_runs import make_schedule


@pytest.fixture
async def registry(repo: JobRepository) -> JobRepository:
    await repo.sync_registry({"default": (10, 86_400)}, {"noop": ("python", 1)})
    return repo


async def test_every_unit_of_a_run_carries_the_schedules_fields(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    cleanup = make_schedule("cleanup", priority=50, fanout={"tenants": ["a", "b"]})
    keyed = make_schedule("keyed", priority=-5, concurrency_key="partner")
    keyless = make_schedule("keyless", concurrency_key="", fanout={"tenants": ["c"]})
    service = CronService(pool, registry, [cleanup, keyed, keyless])
    period = datetime(2026, 5, 31, 2, 0, tzinfo=UTC)
    await service.run_once(now=period - timedelta(minutes=5))
    for name in ("cleanup", "keyed", "keyless"):
        receipt = await service.trigger(name, period, via="api")
        assert receipt.outcome == "created"
    rows = await pool.fetch(
        "SELECT key, priority, concurrency_key FROM dispatcher.jobs ORDER BY key"
    )
    assert [tuple(r) for r in rows] == [
        ("cleanup:2026-05-31T02:00:00Z:a", 50, "a"),  # the unit's tenant as key
        ("cleanup:2026-05-31T02:00:00Z:b", 50, "b"),
        ("keyed:2026-05-31T02:00:00Z:all", -5, "partner"),
        ("keyless:2026-05-31T02:00:00Z:c", 0, None),  # "": no key
    ]


def test_the_follow_up_job_carries_them_too() -> None:
    s = make_schedule("joined", priority=30, on_finished={"handler": "noop"})
    job = s.follow_up_job("joined:2026-05-31T02:00:00Z", datetime(2026, 5, 31, tzinfo=UTC), 1, {})
    assert job is not None and (job.priority, job.concurrency_key) == (30, None)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("priority", 101, "less than or equal to 100"),
        ("priority", -101, "greater than or equal to -100"),
        ("priority", "5", "valid integer"),
        ("priority", 2.5, "valid integer"),
        ("concurrency_key", "k" * 201, "at most 200 characters"),
        ("concurrency_key", 7, "valid string"),
        ("concurrency_key", "a\x00b", "U+0000"),
    ],
)
def test_a_bad_value_refuses_the_schedule_naming_the_field(
    field: str, value: object, fragment: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        make_schedule("bad", **{field: value})
    assert field in str(refused.value) and fragment in str(refused.value), str(refused.value)
