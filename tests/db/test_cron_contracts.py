"""A schedule's per-unit contract (issue 23): `timeout_s`, `expires_after_s` (each unit's time
to live, from its period's start), `on_success` and `on_failure` reach every unit of a run,
queued runs included; a retried trigger asks for the same contract (it finds its units); a
bad value refuses the configuration, naming the field. Key modes do not apply to schedules: a
unit's key is its run's, so there is no setting for them (an unknown field is refused)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from pydantic import ValidationError

from dispatcher.config.settings import Settings
from dispatcher.cron.service import CronService
from dispatcher.db.jobs import JobRepository
from tests.db.test_cron_runs import finish_units, make_schedule

HOOK = {"url": "https://hooks.example/report"}
CONTRACT = {"timeout_s": 20.0, "expires_after_s": 900, "on_success": HOOK, "on_failure": HOOK}


@pytest.fixture
async def registry(repo: JobRepository) -> JobRepository:
    await repo.sync_registry(
        {"default": (10, 86_400)}, {"noop": ("python", 1)}, max_timeout_s={"noop": 60.0}
    )
    return repo


async def contracts(pool: asyncpg.Pool) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT key, timeout_s, expires_at, on_success::text, on_failure::text, has_callback"
        " FROM dispatcher.intents i JOIN dispatcher.job_state s USING (id) ORDER BY key"
    )
    return [tuple(r) for r in rows]


async def test_every_unit_carries_the_schedules_contract_and_a_retry_finds_them(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    period = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    s = make_schedule("report", fanout={"tenants": ["a", "b"]}, **CONTRACT)
    plain = make_schedule("plain")
    service = CronService(pool, registry, [s, plain])
    assert (await service.trigger("report", period, via="api")).outcome == "created"
    assert (await service.trigger("report", period, via="api")).outcome == "existing"
    await service.trigger("plain", period, via="api")
    expires = period + timedelta(seconds=900)
    hook = json.dumps(HOOK)
    run = f"{period:%Y-%m-%dT%H:%M:%SZ}"
    assert await contracts(pool) == [
        (f"plain:{run}:all", None, None, None, None, False),
        (f"report:{run}:a", 20.0, expires, hook, hook, True),
        (f"report:{run}:b", 20.0, expires, hook, hook, True),
    ]


async def test_a_queued_run_keeps_its_units_contract(
    pool: asyncpg.Pool, registry: JobRepository
) -> None:
    # periods of the last hours, with a time to live that has not run out for either
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    s = make_schedule("sweep", overlap="queue", **{**CONTRACT, "expires_after_s": 4 * 3600})
    svc = CronService(pool, registry, [s])
    await svc.trigger("sweep", hour - timedelta(hours=1), via="cron")
    second = await svc.trigger("sweep", hour, via="cron")
    assert second.overlap_decision == "queued"
    assert await finish_units(registry) == 1
    await svc.run_once(now=hour + timedelta(seconds=10))
    rows = await pool.fetch(
        "SELECT timeout_s, expires_at FROM dispatcher.jobs WHERE run_key = $1", second.run_key
    )
    assert [tuple(r) for r in rows] == [(20.0, hour + timedelta(hours=4))]


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"expires_after_s": -1}, "expires_after_s"),
        ({"on_success": {"to": "x"}}, "on_success"),
        ({"on_failure": "https://x"}, "on_failure"),
        ({"handler": "http", "target": HOOK, "timeout_s": 5}, "target.timeout_s"),
        ({"on_key": "replace"}, "on_key"),  # key modes: a unit's key is its run's
    ],
)
def test_a_bad_contract_refuses_the_schedule_naming_the_field(
    fields: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        make_schedule("bad", **fields)
    assert fragment in str(refused.value), str(refused.value)


def test_a_deadline_longer_than_the_handlers_refuses_the_configuration() -> None:
    handlers = {"noop": {"kind": "python", "function": "tests.e2e.handlers:noop", "timeout_s": 30}}
    schedule = {"name": "s", "cron": "0 * * * *", "handler": "noop", "timeout_s": 31}
    with pytest.raises(ValidationError, match="timeout_s 31 is more than handler 'noop' allows"):
        Settings.model_validate({"handlers": handlers, "schedules": [schedule]})
    Settings.model_validate({"handlers": handlers, "schedules": [{**schedule, "timeout_s": 30}]})
