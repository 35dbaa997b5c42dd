"""Key modes at the HTTP doors: `on_key` = replace (debounce) and keep_due (throttle) replace a
job's body while it is still scheduled; `debounce_max_s` bounds how far it is pushed back; a job
already ready is never replaced and the answer says so; reject (the default) stays a 409."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dispatcher.core import rfc3339
from tests.service.intake_app import Api, problem


def job(n: int, due_in_s: float | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"handler": "report", "payload": {"n": n}, **fields}
    if due_in_s is not None:
        body["due_at"] = rfc3339.format(datetime.now(UTC) + timedelta(seconds=due_in_s))
    return body


async def stored(api: Api, key: str) -> Any:
    return await api.repo.pool.fetchrow(
        "SELECT id, payload::text AS payload, due_at, state FROM dispatcher.jobs WHERE key = $1",
        key,
    )


async def test_replace_takes_the_new_body_and_due_time_within_debounce_max(api: Api) -> None:
    r = await api.post_job("d", job(1, due_in_s=60))
    first = await r.json()
    r = await api.post_job("d", job(2, due_in_s=120, on_key="replace"))
    assert r.status == 202, await r.text()
    body = await r.json()
    assert body["replaced"] is True and body["id"] == first["id"]
    row = await stored(api, "d")
    assert row["payload"] == '{"n": 2}'
    assert row["due_at"] > datetime.now(UTC) + timedelta(seconds=100)
    # bounded: never later than acceptance + debounce_max_s
    third = job(3, due_in_s=3600, on_key="replace", debounce_max_s=300)
    r = await api.post_job("d", third)
    assert r.status == 202, await r.text()
    row = await stored(api, "d")
    assert row["payload"] == '{"n": 3}'
    assert row["due_at"] < datetime.now(UTC) + timedelta(seconds=301)
    # the replacing request, retried, is a replay of what the job now is
    r = await api.post_job("d", third)
    assert r.status == 202 and r.headers["Idempotent-Replayed"] == "true"
    assert await api.count() == 1


async def test_keep_due_replaces_the_body_and_keeps_the_first_due_time(api: Api) -> None:
    await api.post_job("t", job(1, due_in_s=60))
    before = await stored(api, "t")
    r = await api.post_job("t", job(2, due_in_s=600, on_key="keep_due"))
    assert r.status == 202, await r.text()
    after = await stored(api, "t")
    assert after["payload"] == '{"n": 2}' and after["due_at"] == before["due_at"]


async def test_a_ready_job_is_never_replaced_and_the_answer_says_so(api: Api) -> None:
    await api.post_job("now", job(1))
    doc = await problem(await api.post_job("now", job(2, on_key="replace")), 409)
    assert "which is ready" in doc["detail"] and "only a scheduled job" in doc["detail"]
    assert doc["state"] == "ready"
    assert (await stored(api, "now"))["payload"] == '{"n": 1}'
    # reject, the default, is today's conflict
    doc = await problem(await api.post_job("now", job(3)), 409)
    assert "different request" in doc["detail"]


async def test_batch_items_replace_one_by_one(api: Api) -> None:
    await api.post_job("a", job(1, due_in_s=60))
    await api.post_job("b", job(1))
    items = [
        {"idempotency_key": "a", **job(2, due_in_s=90, on_key="replace")},
        {"idempotency_key": "b", **job(2, on_key="replace")},
        {"idempotency_key": "c", **job(2, on_key="replace")},
    ]
    r = await api.client.post("/v1/jobs/batch", json={"jobs": items})
    results = (await r.json())["results"]
    assert [x["status"] for x in results] == ["replaced", "not_replaced", "accepted"]
    assert (await stored(api, "a"))["payload"] == '{"n": 2}'


async def test_debounce_max_s_only_with_replace(api: Api) -> None:
    doc = await problem(await api.post_job("x", job(1, debounce_max_s=5)), 422)
    assert 'only with "on_key": "replace"' in doc["detail"]
