"""`POST /v1/jobs/bulk/{action}` on the API as the daemon builds it (with the relay's outbox
rows, as a RabbitMQ daemon leaves them): each action by ids and by filter, its outbox rows
kept right; bad requests answer a problem naming the field and change nothing; the same
Idempotency-Key replays; the route is in the OpenAPI document."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.intake_app import Api, problem
from tests.service.test_api_operator import FUTURE, create, make_dead, make_running, outbox_rows

pytestmark = pytest.mark.usefixtures("relay_transport")


async def bulk(api: Api, action: str, body: Any, key: str | None = None) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    r = await api.client.post(f"/v1/jobs/bulk/{action}", json=body, headers=headers)
    assert r.status == 200, await r.text()
    return await r.json()


async def states(api: Api, *ids: int) -> list[str]:
    return [(await api.repo.get(i) or {}).get("state", "gone") for i in ids]


async def test_each_action_by_ids_keeps_the_outbox_right(api: Api) -> None:
    dead = await create(api, "d")
    await make_dead(api, dead)
    ready = await create(api, "r")
    running = await create(api, "run")
    await make_running(api, running)
    later = await create(api, "s", due_at=FUTURE)

    retried = await bulk(api, "retry", {"ids": [dead, ready, running, later]})
    assert (retried["applied"], retried["became"], retried["not_found"]) == (1, {"ready": 1}, 0)
    assert retried["skipped"]["running"] == {
        "count": 1,
        "reason": "only dead, cancelled or discarded jobs can be retried",
    }
    assert await states(api, dead) == ["ready"] and await outbox_rows(api, dead) == 1

    moved = await bulk(api, "reschedule", {"ids": [dead, later], "due_at": FUTURE})
    assert moved["became"] == {"scheduled": 2}
    assert await outbox_rows(api, dead) == 0  # withdrawn: scheduled jobs have none
    now = await bulk(api, "run_now", {"ids": [dead, ready]})
    assert now["applied"] == 1 and now["skipped"]["ready"]["reason"].endswith("ready already)")
    assert await outbox_rows(api, dead) == 1

    cancelled = await bulk(api, "cancel", {"ids": [dead, ready, running, later]})
    assert cancelled["became"] == {"cancelled": 3, "running": 1}
    assert await states(api, dead, ready, running, later) == [
        "cancelled", "cancelled", "running", "cancelled"
    ]  # fmt: skip
    assert (await api.repo.get(running) or {})["cancel_requested"] is True
    assert [await outbox_rows(api, i) for i in (dead, ready)] == [0, 0]


async def test_by_filter_with_a_dry_run_first(api: Api) -> None:
    ids = [await create(api, f"f-{n}", tenant=f"t{n % 2}") for n in range(6)]
    for job_id in ids:
        await make_dead(api, job_id, "http_4xx" if job_id % 2 else "attempts_exhausted")
    body = {"filter": {"state": "dead", "tenant": "t1"}}

    dry = await bulk(api, "discard", {**body, "dry_run": True})
    assert (dry["matched"], dry["would_apply"], dry["dry_run"]) == (3, 3, True)
    assert {s["state"] for s in dry["sample"]} == {"dead"}
    assert await states(api, *ids) == ["dead"] * 6  # a dry run changes nothing

    done = await bulk(api, "discard", body)
    assert (done["matched"], done["applied"], done["batches"]) == (3, 3, 1)
    assert sorted(await states(api, *ids)) == ["dead"] * 3 + ["discarded"] * 3


async def test_the_same_key_replays_and_another_body_is_a_conflict(api: Api) -> None:
    job = await create(api, "k")
    await make_dead(api, job)
    first = await bulk(api, "retry", {"ids": [job]}, key="retry-once")
    await make_dead(api, job)  # it died again: the same request changes nothing more
    again = await bulk(api, "retry", {"ids": [job]}, key="retry-once")
    assert (first["bulk_id"], first["replayed"], again["replayed"]) == ("retry-once", False, True)
    assert again["applied"] == 1 and await states(api, job) == ["dead"]
    r = await api.client.post(
        "/v1/jobs/bulk/discard", json={"ids": [job]}, headers={"Idempotency-Key": "retry-once"}
    )
    doc = await problem(r, 409)
    assert "names another bulk action" in doc["detail"]
    assert await states(api, job) == ["dead"]


@pytest.mark.parametrize(
    ("action", "body", "field", "words"),
    [
        ("explode", {"ids": [1]}, None, "unknown action 'explode'; actions: retry, cancel"),
        ("retry", {}, None, 'choose the jobs: "ids", a "filter", or "all": true'),
        ("retry", {"filter": {}}, "filter", 'send "all": true to mean it'),
        ("retry", {"ids": [1], "filter": {"state": "dead"}}, None, "not both"),
        ("retry", {"filter": {"colour": "red"}}, "filter.colour", "not a filter of the job"),
        ("retry", {"filter": {"state": "zombie"}}, "filter.state", "must be one of"),
        ("cancel", {"filter": {"queue": "nope"}}, "filter.queue", "unknown queue 'nope'"),
        ("reschedule", {"ids": [1]}, "due_at", 'needs "now" or an RFC 3339 time'),
        ("retry", {"ids": [1], "due_at": "now"}, "due_at", "only a reschedule takes"),
        ("retry", {"ids": list(range(1, 1002))}, "ids", "at most 1000"),
        ("retry", {"ids": [1], "everything": True}, "everything", "Extra inputs"),
    ],
)
async def test_bad_requests_name_the_field_and_change_nothing(
    api: Api, action: str, body: Any, field: str | None, words: str
) -> None:
    job = await create(api, "bad")
    await make_dead(api, job)
    r = await api.client.post(f"/v1/jobs/bulk/{action}", json=body)
    doc = await problem(r, 422)
    assert words in doc["detail"], doc
    if field is not None and "errors" not in doc:
        assert doc["field"] == field
    assert await states(api, job) == ["dead"]


async def test_a_bad_idempotency_key_is_refused(api: Api) -> None:
    r = await api.client.post(
        "/v1/jobs/bulk/retry", json={"all": True}, headers={"Idempotency-Key": "é"}
    )
    await problem(r, 400)


async def test_the_route_is_described(api: Api) -> None:
    r = await api.client.get("/openapi.json")
    doc = await r.json()
    operation = doc["paths"]["/v1/jobs/bulk/{action}"]["post"]
    assert operation["parameters"][0]["schema"]["enum"] == [
        "retry", "cancel", "discard", "reschedule", "run_now"
    ]  # fmt: skip
    assert "ids" in operation["requestBody"]["content"]["application/json"]["schema"]["properties"]
