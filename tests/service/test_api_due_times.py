"""Due times at the HTTP doors: `POST /v1/jobs`, each item of `POST /v1/jobs/batch` and a schedule
trigger take times from 2000-01-01T00:00:00Z through 9999-12-31T23:59:59Z; anything else is a
422 naming the range, never a stored 'infinity' (asyncpg sends datetime.max as one) or a 500."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from dispatcher.api.app import create_app
from dispatcher.config.settings import Settings
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.cron.service import CronService
from dispatcher.db.jobs import JobRepository
from dispatcher.intake.accept import Intake
from tests.service.intake_app import Api, http_job, problem

RANGE = "from 2000-01-01T00:00:00Z through 9999-12-31T23:59:59Z"
REFUSED = {
    "python-datetime-max": "9999-12-31T23:59:59.999999Z",
    "after-the-last-second": "9999-12-31T23:59:59.5Z",
    "year-9999-ends-later-in-utc": "9999-12-31T23:59:59-14:00",
    "year-1-starts-earlier-in-utc": "0001-01-01T00:00:00+14:00",
    "before-2000": "1999-12-31T23:59:59Z",
}


@pytest.mark.parametrize("due", REFUSED.values(), ids=REFUSED.keys())
async def test_single_job_with_a_due_time_out_of_range_is_a_422(api: Api, due: str) -> None:
    doc = await problem(await api.post_job("far-1", http_job(due_at=due)), 422)
    assert doc["detail"] == f"due_at: is out of range; due times run {RANGE}"
    assert await api.count() == 0


async def test_the_last_accepted_second_is_stored_as_sent(api: Api) -> None:
    r = await api.post_job("last-1", http_job(due_at="9999-12-31T23:59:59Z"))
    assert r.status == 202, await r.text()
    stored = await api.repo.pool.fetchrow(
        "SELECT state, due_at, isfinite(due_at) AS finite FROM dispatcher.jobs"
    )
    assert (stored["state"], stored["finite"]) == ("scheduled", True)
    assert stored["due_at"] == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


async def test_batch_refuses_only_the_items_out_of_range(api: Api) -> None:
    items: list[dict[str, Any]] = [{"idempotency_key": "ok-now", **http_job()}]
    for name, due in REFUSED.items():
        items.append({"idempotency_key": name, **http_job(due_at=due)})
    items.append({"idempotency_key": "ok-last", **http_job(due_at="9999-12-31T23:59:59Z")})
    r = await api.client.post("/v1/jobs/batch", json={"jobs": items})
    assert r.status == 200, await r.text()
    results = (await r.json())["results"]
    assert [x["status"] for x in results] == ["accepted"] + ["rejected"] * len(REFUSED) + [
        "accepted"
    ]
    for result in results[1:-1]:
        assert result["error"] == f"due_at: is out of range; due times run {RANGE}"
    assert await api.count() == 2
    assert await api.repo.pool.fetchval("SELECT bool_and(isfinite(due_at)) FROM dispatcher.jobs")


async def test_retry_age_beyond_ten_years_is_refused(api: Api) -> None:
    """The retry budget bounds `now() + delay`: it stays far inside the range."""
    doc = await problem(await api.post_job("age-1", http_job(max_retry_age_s=10**12)), 422)
    assert "max_retry_age_s" in doc["detail"]


# the schedule trigger door ---------------------------------------------------------------------
@pytest.fixture
async def schedules_api(pool: asyncpg.Pool) -> AsyncIterator[TestClient]:
    settings = Settings.model_validate(
        {"handlers": {"noop": {"kind": "python", "function": "x:y"}}}
    )
    repo = JobRepository(pool)
    await repo.sync_registry({"default": (10, 86_400)}, {"noop": ("python", 1)})
    hourly = ScheduleSettings.model_validate(
        {"name": "hourly", "cron": "0 * * * *", "handler": "noop", "timezone": "Pacific/Kiritimati"}
    )

    async def readiness() -> tuple[bool, str]:
        return True, "ok"

    app = create_app(
        repo=repo,
        intake=Intake(settings, repo, lambda t: t),
        readiness=readiness,
        tokens=[],
        body_limit_bytes=settings.body_limit_bytes,
        schedules=CronService(pool, repo, [hourly]),
    )
    async with TestServer(app, host="127.0.0.1", port=0) as server, TestClient(server) as client:
        yield client


@pytest.mark.parametrize(
    ("period", "message"),
    [
        ("0001-01-01T00:00:00+14:00", "out of range"),
        ("0001-01-01T10:00:00Z", "before 2000-01-01T00:00:00Z"),
        ("1990-01-01T10:00:00Z", "before 2000-01-01T00:00:00Z"),
        ("9999-12-31T23:00:00Z", "in the future"),
        ("9999-12-31T23:59:59.999999+00:00", "in the future"),
    ],
)
async def test_trigger_with_a_period_out_of_range_is_a_422(
    schedules_api: TestClient, pool: asyncpg.Pool, period: str, message: str
) -> None:
    r = await schedules_api.post("/v1/schedules/hourly/trigger", json={"period_start": period})
    doc = await problem(r, 422)
    assert message in doc["detail"]
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.runs") == 0
