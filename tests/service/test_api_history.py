"""GET /v1/history on the real API over loopback: the steps of each range with the counts the
daemons added, every queue together by default, and a clear 400 for a bad range or parameter."""

from __future__ import annotations

import pytest

from dispatcher.db.history import Counts, HistoryStore
from dispatcher.engine.history import with_total
from tests.service.intake_app import Api, problem


async def test_history_answers_every_step_of_the_range(api: Api) -> None:
    store = HistoryStore(api.repo.pool)
    await store.add(with_total({"default": Counts(4, 3, 1, 0, (2, 2), 1.5)}))
    await store.add(with_total({"default": Counts(2, 2, 0, 1, (0, 2))}))  # another daemon
    for range_, points, step_s in (("15m", 15, 60), ("24h", 96, 900), ("7d", 84, 7200)):
        r = await api.client.get("/v1/history", params={"queue": "default", "range": range_})
        assert r.status == 200, await r.text()
        body = await r.json()
        assert (body["queue"], body["range"], body["step_s"]) == ("default", range_, step_s)
        assert len(body["points"]) == points
        last = body["points"][-1]
        assert {k: last[k] for k in ("started", "succeeded", "retried", "dead")} == {
            "started": 6,
            "succeeded": 5,
            "retried": 1,
            "dead": 1,
        }
        assert (last["p50_ms"], last["p95_ms"], last["oldest_ready_s"]) == (2.5, 2.5, 1.5)
    r = await api.client.get("/v1/history")  # every queue, 15 minutes
    body = await r.json()
    assert (body["queue"], body["range"]) == ("*", "15m")
    assert sum(p["started"] for p in body["points"]) == 6


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"range": "1y"}, "range must be one of 15m, 24h, 7d"),
        ({"range": "15m", "since": "x"}, "since: not a parameter"),
        ({"queue": "a\x01b"}, "queue must be"),
    ],
)
async def test_bad_requests_are_explained(api: Api, params: dict[str, str], says: str) -> None:
    doc = await problem(await api.client.get("/v1/history", params=params), 400)
    assert says in doc["detail"]


async def test_the_route_is_described(api: Api) -> None:
    doc = await (await api.client.get("/openapi.json")).json()
    operation = doc["paths"]["/v1/history"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"queue", "range"}
    assert "400" in operation["responses"] and "200" in operation["responses"]
