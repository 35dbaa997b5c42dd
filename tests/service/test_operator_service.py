"""The operator service (dispatcher.operator.service) on a real database, without a door: each
refusal is the right kind of error, with a message that names the job and what to do, and
changes nothing; every action, done or refused, writes one audit line naming its actor."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dispatcher.config.settings import Settings
from dispatcher.db.jobs import JobRepository
from dispatcher.intake.requests import DeadLetterRequest
from dispatcher.operator.audit import Actor
from dispatcher.operator.errors import Conflict, Invalid, NotFound
from dispatcher.operator.service import Operator
from tests.service.intake_app import BASE_SETTINGS, Api, http_job

OPS = Actor("oncall", "api")


@pytest.fixture
def operator(api: Api) -> tuple[Operator, list[str]]:
    """The service on the test's database; the list collects its `on_ready` calls."""
    woken: list[str] = []
    settings = Settings.model_validate(BASE_SETTINGS)
    return Operator(api.repo, settings, on_ready=lambda: woken.append("ready")), woken


async def create(api: Api, key: str, **fields: object) -> int:
    r = await api.post_job(key, http_job(**fields))
    assert r.status == 202, await r.text()
    return (await r.json())["id"]  # type: ignore[no-any-return]


async def state(repo: JobRepository, job_id: int) -> str:
    row = await repo.get(job_id)
    assert row is not None
    return str(row["state"])


def audit(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dispatcher.operator" and
            r.getMessage().startswith("operator action ")]  # fmt: skip


async def test_refusals_are_typed_name_the_job_and_change_nothing(
    api: Api, operator: tuple[Operator, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dispatcher.operator")
    service, woken = operator
    job = await create(api, "waiting", due_at="2031-05-31T00:00:00Z")

    with pytest.raises(Conflict) as conflict:
        await service.retry(OPS, job)
    assert conflict.value.detail == (
        f"job {job} is scheduled; only dead, cancelled or discarded jobs can be retried"
    )
    assert conflict.value.context == {"state": "scheduled"}
    with pytest.raises(NotFound, match=r"^no job 424242$"):
        await service.cancel(OPS, 424242)
    long_ago = datetime.now(UTC) - timedelta(days=1)
    with pytest.raises(Invalid) as invalid:
        await service.reschedule(OPS, job, long_ago)
    assert invalid.value.field == "due_at" and 'send "now"' in invalid.value.reason
    with pytest.raises(Invalid) as unknown:
        await service.move_dead_letters(OPS, "redrive", DeadLetterRequest(queue="nope"))
    assert unknown.value.detail == "queue: unknown queue 'nope'; queues: bulk, default"
    with pytest.raises(NotFound, match=r"no queue 'nope'; queues: bulk, default"):
        await service.set_queue_paused(OPS, "nope", paused=True)
    with pytest.raises(NotFound, match="no schedule 'nightly'"):
        await service.trigger(OPS, "nightly", "2026-01-01T00:00:00Z")

    assert await state(api.repo, job) == "scheduled" and woken == []
    assert audit(caplog) == [
        f"operator action retry job {job} by 'oncall' (api): refused: {conflict.value.detail}",
        "operator action cancel job 424242 by 'oncall' (api): refused: no job 424242",
        f"operator action reschedule job {job} to {invalid.value.reason.split()[0]} "
        f"by 'oncall' (api): refused: {invalid.value.detail}",
        "operator action redrive dead letters queue=nope by 'oncall' (api): refused: "
        f"{unknown.value.detail}",
        "operator action pause queue 'nope' by 'oncall' (api): refused: "
        "no queue 'nope'; queues: bulk, default",
        "operator action trigger schedule 'nightly' by 'oncall' (api): refused: "
        "no schedule 'nightly' (known: none configured)",
    ]


async def test_actions_act_wake_the_workers_and_are_audited(
    api: Api,
    operator: tuple[Operator, list[str]],
    caplog: pytest.LogCaptureFixture,
    pool: asyncpg.Pool,
) -> None:
    caplog.set_level(logging.INFO, logger="dispatcher.operator")
    service, woken = operator
    job = await create(api, "later", due_at="2031-05-31T00:00:00Z")

    assert (await service.run_now(Actor("alice", "cli"), job))["state"] == "ready"
    assert woken == ["ready"]  # the workers look at once
    assert (await service.cancel(Actor("ops", "console"), job))["state"] == "cancelled"
    paused = await service.set_queue_paused(OPS, "default", paused=True)
    assert paused["paused"] is True
    assert await pool.fetchval("SELECT paused FROM dispatcher.queues WHERE name = 'default'")
    counted = await service.move_dead_letters(
        OPS, "redrive", DeadLetterRequest(queue="default", dry_run=True)
    )
    assert (counted["count"], woken) == (0, ["ready"])  # a dry run moves and wakes nothing
    assert audit(caplog) == [
        f"operator action run_now job {job} by 'alice' (cli): done",
        f"operator action cancel job {job} by 'ops' (console): done",
        "operator action pause queue 'default' by 'oncall' (api): done",
        "operator action redrive dead letters (dry run) queue=default by 'oncall' (api): matched 0",
    ]
