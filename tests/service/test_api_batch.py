"""POST /v1/jobs/batch: up to 1,000 items, per-item results in order, one bad item never rejects
the others, and a retried batch converges on the same jobs."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientResponse

from tests.harness import stored_job
from tests.service.intake_app import Api, http_job, problem, serve_api

# run as a RabbitMQ daemon leaves the database: ready jobs get the outbox rows looked at here
pytestmark = pytest.mark.usefixtures("relay_transport")


def item(key: Any, **fields: Any) -> dict[str, Any]:
    return {"idempotency_key": key, **http_job(**fields)}


async def post_batch(api: Api, body: Any) -> ClientResponse:
    return await api.client.post("/v1/jobs/batch", json=body)


async def results_of(r: ClientResponse) -> list[dict[str, Any]]:
    assert r.status == 200, await r.text()
    body = await r.json()
    assert set(body) == {"results"}
    return body["results"]  # type: ignore[no-any-return]


async def test_mixed_batch_answers_each_item_in_order(api: Api) -> None:
    items: list[Any] = [
        item("ok-now"),  # 0 accepted, ready
        item("bad-field", urgency=1),  # 1 unknown field
        item("ok-later", due_at="2031-05-31T00:00:00Z"),  # 2 accepted, scheduled
        item("bad-handler", handler="fax"),  # 3 unknown handler
        {"handler": "http", "target": {"url": "https://a.example/"}},  # 4 no key
        item("x" * 256),  # 5 key too long
        item("caf\u00e9"),  # 6 key not ASCII
        item(17),  # 7 key not a string
        item("bad-past", due_at="2020-01-01T00:00:00Z"),  # 8 long past
        item("bad-payload", payload=[1]),  # 9 payload not an object
        item("bad-target", target={"url": "https://10.0.0.1/"}),  # 10 private target
        "not an object",  # 11
        item("ok-bulk", queue="bulk"),  # 12 accepted
    ]
    results = await results_of(await post_batch(api, {"jobs": items}))

    assert [r["index"] for r in results] == list(range(len(items)))
    statuses = [r["status"] for r in results]
    accepted = {0, 2, 12}
    assert statuses == ["accepted" if i in accepted else "rejected" for i in range(len(items))]
    errors = {i: r["error"] for i, r in enumerate(results) if r["status"] == "rejected"}
    expected = {
        1: "urgency: Extra inputs are not permitted",
        3: "unknown handler 'fax'",
        4: "idempotency_key: Field required",
        5: "idempotency_key",
        6: "idempotency_key: 1 to 255 printable ASCII",
        7: "idempotency_key: Input should be a valid string",
        8: "in the past",
        9: "payload: Input should be a valid dictionary",
        10: "private",
        11: "item must be a JSON object",
    }
    for index, fragment in expected.items():
        assert fragment in errors[index], (index, errors[index])

    assert results[0]["state"] == "ready"
    assert results[2]["state"] == "scheduled"
    stored = {
        r["key"]: r["id"] for r in await api.repo.pool.fetch("SELECT key, id FROM dispatcher.jobs")
    }
    assert stored == {
        "ok-now": results[0]["id"],
        "ok-later": results[2]["id"],
        "ok-bulk": results[12]["id"],
    }
    assert await api.count("outbox") == 2  # the two due now


async def test_a_retried_batch_converges_on_the_same_jobs(api: Api) -> None:
    items = [item(f"unit-{i}", payload={"unit": i}) for i in range(40)]
    first = await results_of(await post_batch(api, {"jobs": items}))
    assert {r["status"] for r in first} == {"accepted"}

    again = await results_of(await post_batch(api, {"jobs": items}))
    assert {r["status"] for r in again} == {"existing"}
    assert [r["id"] for r in again] == [r["id"] for r in first]
    assert (await api.count(), await api.count("outbox")) == (40, 40)


async def test_a_partly_applied_batch_converges_when_retried(api: Api) -> None:
    items = [item(f"range-{i}", payload={"range": i}) for i in range(10)]
    # the first attempt got only the first four items through (e.g. the connection dropped)
    head = await results_of(await post_batch(api, {"jobs": items[:4]}))
    whole = await results_of(await post_batch(api, {"jobs": items}))
    assert [r["status"] for r in whole] == ["existing"] * 4 + ["accepted"] * 6
    assert [r["id"] for r in whole[:4]] == [r["id"] for r in head]
    assert await api.count() == 10


async def test_concurrent_identical_batches_make_each_job_once(api: Api) -> None:
    items = [item(f"c-{i}", payload={"i": i}) for i in range(100)]
    answers = await asyncio.gather(*(post_batch(api, {"jobs": items}) for _ in range(5)))
    all_results = [await results_of(a) for a in answers]
    for i in range(100):
        ids = {results[i]["id"] for results in all_results}
        assert len(ids) == 1
        statuses = sorted(results[i]["status"] for results in all_results)
        assert statuses == ["accepted"] + ["existing"] * 4
    assert (await api.count(), await api.count("outbox")) == (100, 100)


async def test_changed_item_under_an_existing_key_is_a_conflict(api: Api) -> None:
    original = await results_of(await post_batch(api, {"jobs": [item("k-1", payload={"v": 1})]}))
    results = await results_of(
        await post_batch(
            api,
            {
                "jobs": [
                    item("k-1", payload={"v": 2}),
                    item("k-2"),
                ]
            },
        )
    )
    assert results[0]["status"] == "conflict"
    assert results[0]["id"] == original[0]["id"]
    assert "different request" in results[0]["error"]
    assert results[1]["status"] == "accepted"
    stored = await stored_job(api.repo.pool, key="k-1")
    assert stored is not None and stored["payload"] == {"v": 1}


async def test_duplicate_keys_inside_one_batch(api: Api) -> None:
    results = await results_of(
        await post_batch(
            api,
            {
                "jobs": [
                    item("d-1", payload={"v": 1}),
                    item("d-1", payload={"v": 1}),
                    item("d-1", payload={"v": 2}),
                ]
            },
        )
    )
    assert [r["status"] for r in results] == ["accepted", "existing", "conflict"]
    assert len({r["id"] for r in results}) == 1
    assert await api.count() == 1


async def test_a_bare_list_is_taken_as_the_jobs(api: Api) -> None:
    results = await results_of(await post_batch(api, [item("bare-1"), item("bare-2")]))
    assert [r["status"] for r in results] == ["accepted", "accepted"]


async def test_1000_items_are_accepted(api: Api) -> None:
    items = [item(f"grant-{i:04d}", payload={"g": i}) for i in range(1000)]
    results = await results_of(await post_batch(api, {"jobs": items}))
    assert len(results) == 1000
    assert {r["status"] for r in results} == {"accepted"}
    assert [r["key"] for r in results] == [f"grant-{i:04d}" for i in range(1000)]
    assert len({r["id"] for r in results}) == 1000
    assert (await api.count(), await api.count("outbox")) == (1000, 1000)
    assert api.wakes == ["ready"]  # one wake-up for the whole batch


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"jobs": [item(f"k-{i}") for i in range(1001)]}, "at most 1000 items"),
        ({"jobs": []}, "at least 1 item"),
        ({}, "jobs: Field required"),
        ({"jobs": [item("k")], "atomic": True}, "atomic: Extra inputs are not permitted"),
        ({"jobs": "all of them"}, "jobs: Input should be a valid list"),
    ],
    ids=["1001-items", "empty", "no-jobs", "unknown-field", "jobs-not-a-list"],
)
async def test_a_malformed_batch_is_refused_whole(api: Api, body: Any, detail: str) -> None:
    doc = await problem(await post_batch(api, body), 422)
    assert detail in doc["detail"]
    assert "1 to 1000 items" in doc["detail"]
    assert await api.count() == 0


async def test_a_batch_over_the_body_limit_is_413(pool: asyncpg.Pool) -> None:
    async with serve_api(pool, body_limit_bytes=4096) as api:
        doc = await problem(
            await post_batch(
                api, {"jobs": [item(f"k-{i}", payload={"pad": "x" * 200}) for i in range(40)]}
            ),
            413,
        )
        assert "limit of 4096 bytes" in doc["detail"]
        assert await api.count() == 0


async def test_invalid_json_is_a_problem(api: Api) -> None:
    r = await api.client.post(
        "/v1/jobs/batch", data=b'{"jobs": [', headers={"Content-Type": "application/json"}
    )
    doc = await problem(r, 400)
    assert "not valid JSON" in doc["detail"]


async def test_a_trailing_newline_or_non_ascii_digits_reject_only_their_item(api: Api) -> None:
    """`$` in a Python regex also matches before a final newline, and `\\d` matches any
    script's digits: neither may slip an item past the API to fail the whole batch later."""
    items: list[Any] = [
        item("nl-key\n"),
        item("nl-due", due_at="2031-05-31T00:00:00Z\n"),
        item("arabic-digits", due_at="٢٠٣١-05-31T00:00:00Z"),
        item("fine"),
    ]
    results = await results_of(await post_batch(api, {"jobs": items}))
    assert [r["status"] for r in results] == ["rejected", "rejected", "rejected", "accepted"]
    assert "idempotency_key: 1 to 255 printable ASCII" in results[0]["error"]
    assert "RFC 3339" in results[1]["error"] and "RFC 3339" in results[2]["error"]
