"""`PUT /v1/queues/{name}/keys/{key}` and `DELETE` (issue 22 point 4) on the real API over
loopback: an override is stored and the next claim honours it, DELETE goes back to the queue's
limits, and every bad request is a problem document that changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.db.test_global_limits import CAPABILITIES
from tests.db.test_key_limits import running_by_key, setup
from tests.service.intake_app import Api, problem


async def overrides(api: Api) -> list[Any]:
    return list(await api.repo.pool.fetch("SELECT key, max_inflight FROM dispatcher.key_limits"))


async def test_put_stores_an_override_the_claim_honours_and_delete_removes_it(api: Api) -> None:
    await setup(api.repo, (None, None, 1), {"acct-7": 10, "acct-8": 10})
    r = await api.client.put("/v1/queues/default/keys/acct-7", json={"max_inflight": 3})
    assert r.status == 200, await r.text()
    body = await r.json()
    assert (body["queue"], body["key"], body["max_inflight"], body["rate_per_s"]) == (
        "default",
        "acct-7",
        3,
        None,
    )
    await api.repo.claim_limited("default", 40, CAPABILITIES, "d0", 60)
    assert await running_by_key(api.repo.pool) == {"acct-7": 3, "acct-8": 1}
    r = await api.client.delete("/v1/queues/default/keys/acct-7")
    assert r.status == 200 and (await r.json())["had_override"] is True
    r = await api.client.delete("/v1/queues/default/keys/acct-7")  # idempotent
    assert r.status == 200 and (await r.json())["had_override"] is False
    assert await overrides(api) == []


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/queues/nope/keys/k", {"max_inflight": 1}, 404, "no queue 'nope'"),
        ("/v1/queues/default/keys/k", {}, 422, "give at least one of"),
        ("/v1/queues/default/keys/k", {"max_inflight": 0}, 422, "max_inflight: must be"),
        ("/v1/queues/default/keys/k", {"max_inflight": "3"}, 422, "max_inflight: must be a"),
        ("/v1/queues/default/keys/k", {"rate_per_s": -1}, 422, "rate_per_s: must be a positive"),
        ("/v1/queues/default/keys/k", {"burst": 5}, 422, "give rate_per_s too"),
        # past the database's columns: was a 500 (schemathesis found burst 359082599567723)
        ("/v1/queues/default/keys/k", {"rate_per_s": 1, "burst": 2**31}, 422, "burst: must be"),
        ("/v1/queues/default/keys/k", {"rate_per_s": 2.8e16}, 422, "rate_per_s: must be a"),
        ("/v1/queues/default/keys/k", {"max_infight": 3}, 422, "body must be"),
        ("/v1/queues/default/keys/" + "k" * 201, {"max_inflight": 1}, 422, "1 to 200"),
    ],
)
async def test_bad_requests_are_refused_and_change_nothing(
    api: Api, path: str, body: Any, status: int, says: str
) -> None:
    doc = await problem(await api.client.put(path, json=body), status)
    assert says in doc["detail"], doc
    assert await overrides(api) == []
