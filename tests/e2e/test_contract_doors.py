"""The per-job contracts at the HTTP doors and in the Python client, on a real daemon: a job's
`on_success` / `on_failure` targets, `timeout_s` and `expires_at` are accepted in a single
request, in batch items and through `AsyncClient`, and take effect; each bad value is refused
with a clear error naming the field and the fix, per item in a batch, and changes nothing; a
replay with the same contract finds the job, one with another contract is a conflict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

from dispatcher.client import AsyncClient
from dispatcher.client.http import ApiError, Conflict, Job
from tests.harness import Target, make_settings, running_daemon, serve_target, wait_until

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NAP = "tests.e2e.contract_handlers:nap"
HANDLERS = {"nap": {"kind": "python", "function": NAP, "transactional": False, "timeout_s": 60}}


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def test_the_doors_accept_a_contract_and_it_takes_effect(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    settings = make_settings(
        db_url,
        handlers=HANDLERS,
        http={"signing_secret": SECRET},
        queues={"default": {}, "slow": {}},
    )
    async with (
        serve_target(Target()) as hooks,
        running_daemon(settings) as d,
        AsyncClient(d.base_url) as client,
    ):
        await conn.execute(
            "UPDATE dispatcher.queues SET paused = true, paused_at = now() WHERE name = 'slow'"
        )
        await client.enqueue("order-7", "nap", {"s": 0}, on_success={"url": hooks.url})
        cut = Job(
            "cut", "nap", {"s": 30}, timeout_s=0.3, max_attempts=1, on_failure={"url": hooks.url}
        )
        paused = Job("paused", "nap", queue="slow", expires_at=later(1))
        results = await client.enqueue_many([cut, paused])
        assert [r["status"] for r in results] == ["accepted", "accepted"]

        await wait_until(lambda: len(hooks.requests) == 2, timeout_s=20, what="two callbacks")
        events = [Webhook(SECRET).verify(r["body"], r["headers"]) for r in hooks.requests]
        by_key = {e["data"]["key"]: e for e in events}
        assert by_key["order-7"]["type"] == "job.succeeded"
        assert (by_key["cut"]["type"], by_key["cut"]["data"]["last_error"]) == (
            "job.dead",
            "attempt timed out",
        )

        async def expired() -> bool:
            row = await conn.fetchrow(
                "SELECT state, dead_reason FROM dispatcher.job_state WHERE id = $1",
                results[1]["id"],
            )
            return tuple(row) == ("dead", "expired")

        await wait_until(expired, timeout_s=10, what="the job in a paused queue to expire")
    await conn.close()


REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"handler": "nap", "timeout_s": 61}, "more than handler 'nap' allows (60 s"),
    ({"handler": "nap", "timeout_s": 0}, "timeout_s"),
    (
        {"handler": "http", "target": {"url": "http://127.0.0.1:9/"}, "timeout_s": 5},
        "target.timeout_s",
    ),
    ({"handler": "nap", "expires_at": "2020-01-01T00:00:00Z"}, "expires_at: 2020-01-01"),
    (
        {"handler": "nap", "due_at": "2099-01-02T00:00:00Z", "expires_at": "2099-01-01T00:00:00Z"},
        "expires_at must be later than due_at",
    ),
    ({"handler": "nap", "on_success": {"url": "http://10.1.2.3/hook"}}, "on_success: "),
    ({"handler": "nap", "on_failure": {"nope": 1}}, "on_failure: "),
]


@pytest.mark.parametrize(("body", "detail"), REFUSALS)
async def test_a_bad_contract_is_refused_at_each_door_and_changes_nothing(
    db_url: str, body: dict[str, Any], detail: str
) -> None:
    conn = await asyncpg.connect(db_url)
    settings = make_settings(db_url, handlers=HANDLERS, queues={"default": {}, "slow": {}})
    async with running_daemon(settings) as d:
        async with d.session.post(
            f"{d.base_url}/v1/jobs", json=body, headers={"Idempotency-Key": "bad"}
        ) as r:
            problem = await r.json()
            assert r.status in (400, 422), problem
            assert detail in problem["detail"], problem
        good = {"handler": "nap", "idempotency_key": "good"}
        async with d.session.post(
            f"{d.base_url}/v1/jobs/batch",
            json={"jobs": [{**body, "idempotency_key": "bad"}, good]},
        ) as r:
            answer = await r.json()
            bad_item, good_item = answer["results"]
            assert detail in bad_item["error"], bad_item
            assert good_item["status"] == "accepted"
        keys = [r["key"] for r in await conn.fetch("SELECT key FROM dispatcher.intents")]
        assert keys == ["good"]
    await conn.close()


async def test_a_replay_with_another_contract_is_a_conflict(db_url: str) -> None:
    settings = make_settings(db_url, handlers=HANDLERS)
    async with running_daemon(settings) as d, AsyncClient(d.base_url) as client:
        expires = later(3600)
        first = await client.enqueue("k", "nap", due_at=later(600), expires_at=expires)
        again = await client.enqueue("k", "nap", due_at=first["due_at"], expires_at=expires)
        assert again["id"] == first["id"]
        with pytest.raises(Conflict):
            await client.enqueue("k", "nap", due_at=first["due_at"], expires_at=later(7200))
        with pytest.raises(Conflict):
            await client.enqueue("k", "nap", due_at=first["due_at"])
        with pytest.raises(ApiError):
            await client.enqueue("k2", "nap", timeout_s=120)
