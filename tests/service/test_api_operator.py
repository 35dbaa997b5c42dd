"""The operator API: the status resource, listing with filters and a cursor, retry and cancel."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from tests.service.intake_app import TARGET, Api, http_job, problem, serve_api

# run as a RabbitMQ daemon leaves the database: ready jobs get the outbox rows looked at here
pytestmark = pytest.mark.usefixtures("relay_transport")

FUTURE = "2031-05-31T00:00:00Z"


async def create(api: Api, key: str, **fields: Any) -> int:
    r = await api.post_job(key, http_job(**fields))
    assert r.status == 202, await r.text()
    return (await r.json())["id"]  # type: ignore[no-any-return]


async def make_dead(api: Api, job_id: int, reason: str = "attempts_exhausted") -> None:
    """What the executor leaves behind when a job exhausts its attempts."""
    async with api.repo.transaction() as conn:
        await conn.execute("DELETE FROM dispatcher.outbox WHERE job_id = $1", job_id)
        await conn.execute(
            "UPDATE dispatcher.jobs SET state = 'dead', attempt = 10, dead_reason = $2,"
            " last_error = 'HTTP 503 from target', started_at = now(), finished_at = now()"
            " WHERE id = $1",
            job_id,
            reason,
        )


async def make_running(api: Api, job_id: int) -> None:
    async with api.repo.transaction() as conn:
        await conn.execute("DELETE FROM dispatcher.outbox WHERE job_id = $1", job_id)
        await conn.execute(
            "UPDATE dispatcher.jobs SET state = 'running', attempt = 1, lease_owner = 'w:1',"
            " lease_expires_at = now() + interval '1 minute', started_at = now() WHERE id = $1",
            job_id,
        )


async def outbox_rows(api: Api, job_id: int) -> int:
    return await api.repo.pool.fetchval(
        "SELECT count(*) FROM dispatcher.outbox WHERE job_id = $1", job_id
    )


async def get_json(api: Api, path: str) -> Any:
    r = await api.client.get(path)
    assert r.status == 200, await r.text()
    return await r.json()


# the status resource ----------------------------------------------------------------------------
async def test_get_job_shows_the_status_resource(api: Api) -> None:
    job_id = await create(api, "show-1", tenant="t-1", due_at=FUTURE, max_attempts=5)
    view = await get_json(api, f"/v1/jobs/{job_id}")
    assert view["id"] == job_id
    assert view["key"] == "show-1"
    assert view["state"] == "scheduled"
    assert (view["queue"], view["tenant"], view["handler"]) == ("default", "t-1", "http")
    assert view["target_url"] == TARGET["url"]
    assert (view["attempt"], view["max_attempts"]) == (0, 5)
    assert datetime.fromisoformat(view["due_at"]) == datetime(2031, 5, 31, tzinfo=UTC)
    assert datetime.fromisoformat(view["created_at"]) <= datetime.now(UTC)
    for absent in ("started_at", "finished_at", "last_error", "dead_reason", "result"):
        assert view[absent] is None, absent


async def test_get_shows_why_a_job_died(api: Api) -> None:
    job_id = await create(api, "dead-view")
    await make_dead(api, job_id)
    view = await get_json(api, f"/v1/jobs/{job_id}")
    assert view["state"] == "dead"
    assert (view["dead_reason"], view["last_error"]) == (
        "attempts_exhausted",
        "HTTP 503 from target",
    )
    assert view["finished_at"] is not None


@pytest.mark.parametrize("path", ["/v1/jobs/999999", "/v1/jobs/abc", "/v1/jobs/-1", "/v1/jobs/1e3"])
async def test_get_unknown_job_is_404(api: Api, path: str) -> None:
    doc = await problem(await api.client.get(path), 404)
    assert "no job" in doc["detail"]


# listing ----------------------------------------------------------------------------------------
async def test_list_is_newest_first_and_filters_by_state_and_queue(api: Api) -> None:
    ready = await create(api, "l-ready")
    scheduled = await create(api, "l-scheduled", due_at=FUTURE)
    dead = await create(api, "l-dead")
    bulk_dead = await create(api, "l-bulk-dead", queue="bulk")
    await make_dead(api, dead)
    await make_dead(api, bulk_dead)

    everything = await get_json(api, "/v1/jobs")
    assert [j["id"] for j in everything["items"]] == [bulk_dead, dead, scheduled, ready]
    assert everything["next_cursor"] is None

    dead_letters = await get_json(api, "/v1/jobs?state=dead")
    assert [j["id"] for j in dead_letters["items"]] == [bulk_dead, dead]
    assert {j["state"] for j in dead_letters["items"]} == {"dead"}

    bulk = await get_json(api, "/v1/jobs?state=dead&queue=bulk")
    assert [j["id"] for j in bulk["items"]] == [bulk_dead]
    assert [j["id"] for j in (await get_json(api, "/v1/jobs?state=scheduled"))["items"]] == [
        scheduled
    ]
    assert (await get_json(api, "/v1/jobs?state=succeeded"))["items"] == []


async def test_list_pages_with_a_cursor(api: Api) -> None:
    ids = [await create(api, f"page-{i}") for i in range(5)]
    seen: list[int] = []
    pages = 0
    path = "/v1/jobs?limit=2"
    while True:
        page = await get_json(api, path)
        pages += 1
        assert len(page["items"]) <= 2
        seen += [j["id"] for j in page["items"]]
        if page["next_cursor"] is None:
            break
        path = f"/v1/jobs?limit=2&cursor={page['next_cursor']}"
        assert pages < 10
    assert seen == sorted(ids, reverse=True)  # every job once, newest first
    assert pages == 3


async def test_the_cursor_keeps_the_filter(api: Api) -> None:
    ids = [await create(api, f"f-{i}") for i in range(6)]
    for job_id in ids[::2]:
        await make_dead(api, job_id)
    first = await get_json(api, "/v1/jobs?state=dead&limit=2")
    rest = await get_json(api, f"/v1/jobs?state=dead&limit=2&cursor={first['next_cursor']}")
    listed = [j["id"] for j in first["items"] + rest["items"]]
    assert listed == sorted(ids[::2], reverse=True)


@pytest.mark.parametrize(
    ("query", "detail"),
    [
        ("state=zombie", "state: must be one of scheduled, ready, running, succeeded, dead"),
        ("limit=0", "limit: an integer from 1 to 1000"),
        ("limit=1001", "limit: an integer from 1 to 1000"),
        ("limit=ten", "limit: an integer from 1 to 1000"),
        ("cursor=abc", "cursor: pass the next_cursor of the previous page"),
        ("cursor=%C2%B2", "cursor: pass the next_cursor of the previous page"),
        ("queue=%00", "queue: a queue name from the configuration"),
    ],
)
async def test_bad_list_parameters_are_422(api: Api, query: str, detail: str) -> None:
    doc = await problem(await api.client.get(f"/v1/jobs?{query}"), 422)
    assert detail in doc["detail"]


# retry ------------------------------------------------------------------------------------------
async def test_retry_of_a_dead_job_makes_it_ready_with_a_fresh_budget(api: Api) -> None:
    job_id = await create(api, "retry-1")
    await make_dead(api, job_id)
    assert await outbox_rows(api, job_id) == 0
    wakes_before = len(api.wakes)

    r = await api.client.post(f"/v1/jobs/{job_id}/retry")
    assert r.status == 200, await r.text()
    view = await r.json()
    assert (view["id"], view["state"], view["attempt"]) == (job_id, "ready", 0)
    assert (view["dead_reason"], view["finished_at"]) == (None, None)
    assert await outbox_rows(api, job_id) == 1  # deliverable again
    assert len(api.wakes) == wakes_before + 1  # and the workers were told

    # a second retry finds it ready: nothing to retry, and no second outbox row
    doc = await problem(await api.client.post(f"/v1/jobs/{job_id}/retry"), 409)
    assert doc["detail"] == (
        f"job {job_id} is ready; only dead, cancelled or discarded jobs can be retried"
    )
    assert await outbox_rows(api, job_id) == 1


async def test_retry_of_a_cancelled_job(api: Api) -> None:
    job_id = await create(api, "retry-2", due_at=FUTURE)
    assert (await api.client.post(f"/v1/jobs/{job_id}/cancel")).status == 200
    r = await api.client.post(f"/v1/jobs/{job_id}/retry")
    assert r.status == 200, await r.text()
    assert (await r.json())["state"] == "ready"
    assert await outbox_rows(api, job_id) == 1


@pytest.mark.parametrize("state", ["scheduled", "ready", "running"])
async def test_retry_of_a_live_job_is_409(api: Api, state: str) -> None:
    job_id = await create(
        api, f"retry-{state}", **({"due_at": FUTURE} if state == "scheduled" else {})
    )
    if state == "running":
        await make_running(api, job_id)
    doc = await problem(await api.client.post(f"/v1/jobs/{job_id}/retry"), 409)
    assert f"job {job_id} is {state}" in doc["detail"]
    view = await get_json(api, f"/v1/jobs/{job_id}")
    assert view["state"] == state


async def test_retry_of_an_unknown_job_is_404(api: Api) -> None:
    await problem(await api.client.post("/v1/jobs/424242/retry"), 404)
    await problem(await api.client.post("/v1/jobs/x/retry"), 404)


# cancel -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("due_at", [FUTURE, None], ids=["scheduled", "ready"])
async def test_cancel_of_a_waiting_job(api: Api, due_at: str | None) -> None:
    job_id = await create(api, "cancel-1", **({"due_at": due_at} if due_at else {}))
    r = await api.client.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status == 200, await r.text()
    view = await r.json()
    assert view["state"] == "cancelled"
    assert view["finished_at"] is not None
    assert await outbox_rows(api, job_id) == 0  # nothing left to deliver

    doc = await problem(await api.client.post(f"/v1/jobs/{job_id}/cancel"), 409)
    assert doc["detail"] == f"job {job_id} is already cancelled; nothing to cancel"


async def test_cancel_of_a_running_job_requests_cancellation(api: Api) -> None:
    job_id = await create(api, "cancel-running")
    await make_running(api, job_id)
    r = await api.client.post(f"/v1/jobs/{job_id}/cancel")
    assert r.status == 200, await r.text()
    view = await r.json()
    assert (view["state"], view["cancel_requested"]) == ("running", True)


async def test_cancel_of_a_dead_job_is_409(api: Api) -> None:
    job_id = await create(api, "cancel-dead")
    await make_dead(api, job_id)
    doc = await problem(await api.client.post(f"/v1/jobs/{job_id}/cancel"), 409)
    assert f"job {job_id} is already dead" in doc["detail"]
    assert (await get_json(api, f"/v1/jobs/{job_id}"))["state"] == "dead"


async def test_cancel_of_an_unknown_job_is_404(api: Api) -> None:
    await problem(await api.client.post("/v1/jobs/424242/cancel"), 404)


async def test_operator_actions_need_the_token(pool: asyncpg.Pool) -> None:
    async with serve_api(pool, api_tokens=["op-token"]) as api:
        auth = {"Authorization": "Bearer op-token"}
        r = await api.post_job("op-1", http_job(), headers=auth)
        job_id = (await r.json())["id"]
        for method, path in (
            ("GET", f"/v1/jobs/{job_id}"),
            ("GET", "/v1/jobs"),
            ("POST", f"/v1/jobs/{job_id}/retry"),
            ("POST", f"/v1/jobs/{job_id}/cancel"),
        ):
            await problem(await api.client.request(method, path), 401)
        assert (await api.repo.get(job_id) or {})["state"] == "ready"  # the cancel was refused
        r = await api.client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
        assert r.status == 200
