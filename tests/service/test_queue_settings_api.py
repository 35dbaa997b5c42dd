"""PATCH /v1/queues/{name} and POST /v1/queues/{name}/reset on the API as the daemon builds it
(real PostgreSQL, real loopback HTTP): a change shows in GET /v1/queues with its source and the
file's value beside it, and puts the limits in force; an unknown queue is 404 and a bad value
422 naming the field, and neither changes anything."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.db.queue_limits import QueueSettingsRepository
from dispatcher.operator.queue_limits import file_settings
from tests.service.intake_app import Api, problem


async def recorded(api: Api) -> QueueSettingsRepository:
    """What the daemon records at start: the file's live settings of each queue."""
    store = QueueSettingsRepository(api.repo.pool)
    await store.record_file_settings({q: file_settings(c) for q, c in api.settings.queues.items()})
    return store


async def queue_view(api: Api, name: str = "default") -> dict[str, Any]:
    response = await api.client.get("/v1/queues")
    assert response.status == 200
    (view,) = [q for q in (await response.json())["queues"] if q["name"] == name]
    return view  # type: ignore[no-any-return]


async def test_a_change_shows_with_its_source_until_reset(api: Api) -> None:
    await recorded(api)
    file_rate = api.settings.queues["default"].rate_per_s
    response = await api.client.patch(
        "/v1/queues/default", json={"rate_per_s": 20, "windows": ["Mon-Fri 18:00-07:00 UTC"]}
    )
    assert response.status == 200, await response.text()
    answered = await response.json()
    assert answered["settings"]["rate_per_s"] == {
        "value": 20.0,
        "source": "override",
        "file": file_rate,
    }
    view = await queue_view(api)
    assert view["settings"]["rate_per_s"]["source"] == "override"
    assert view["settings"]["burst"]["source"] == "file"
    assert view["limits"]["rate_per_s"] == 20.0
    assert view["settings"]["windows"]["value"] == ["Mon-Fri 18:00-07:00 UTC"]
    assert isinstance(view["window_open"], bool)
    assert (view["window_opens_at"] is None) == view["window_open"]
    stored = await api.repo.pool.fetchval(
        "SELECT rate_per_s FROM dispatcher.queues WHERE name = 'default'"
    )
    assert stored == 20.0

    response = await api.client.post("/v1/queues/default/reset")
    assert response.status == 200
    view = await queue_view(api)
    assert view["settings"]["rate_per_s"] == {
        "value": file_rate,
        "source": "file",
        "file": file_rate,
    }
    assert view["window_open"] is True and view["window_opens_at"] is None


async def test_null_removes_one_override(api: Api) -> None:
    await recorded(api)
    await api.client.patch("/v1/queues/default", json={"max_inflight": 7, "burst": 9})
    response = await api.client.patch("/v1/queues/default", json={"max_inflight": None})
    assert response.status == 200
    settings = (await response.json())["settings"]
    assert settings["max_inflight"]["source"] == "file"
    assert settings["burst"] == {"value": 9, "source": "override", "file": 1000}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"rate_per_s": 0}, "rate_per_s", "greater than 0"),
        ({"rate_per_s": "fast"}, "rate_per_s", "number"),
        ({"burst": 1.5}, "burst", "integer"),
        ({"max_inflight": 0}, "max_inflight", "greater than or equal to 1"),
        ({"max_inflight": True}, "max_inflight", "integer"),
        ({"key_burst": -1}, "key_burst", "greater than or equal to 1"),
        ({"key_burst": 4}, "key_burst", "set key_rate_per_s too"),
        ({"windows": ["Mon-Fri 18:00-07:00 Mars/Olympus"]}, "windows", "Mars/Olympus"),
        ({"windows": "Mon-Fri 18:00-07:00"}, "windows", "list"),
        ({"max_attempts": 3}, "max_attempts", "cannot be changed at run time"),
        ({}, "body", "name at least one"),
        ([1], "body", "JSON object"),
    ],
)
async def test_a_bad_value_is_422_naming_the_field_and_changes_nothing(
    api: Api, body: Any, field: str, words: str
) -> None:
    await recorded(api)
    await api.client.patch("/v1/queues/default", json={"burst": 9})
    before = await QueueSettingsRepository(api.repo.pool).all()
    if isinstance(body, dict) and body:  # a good value beside the bad one is not applied either
        body = {"max_inflight" if field == "burst" else "burst": 3, **body}
    response = await api.client.patch("/v1/queues/default", json=body)
    doc = await problem(response, 422)
    assert doc["field"] == field
    assert doc["detail"].startswith(f"{field}: ") and words in doc["detail"]
    assert await QueueSettingsRepository(api.repo.pool).all() == before


async def test_an_unknown_queue_is_404_listing_the_queues(api: Api) -> None:
    await recorded(api)
    for response in (
        await api.client.patch("/v1/queues/nope", json={"rate_per_s": 5}),
        await api.client.patch("/v1/queues/nope", json={"rate_per_s": -5}),
        await api.client.post("/v1/queues/nope/reset"),
    ):
        doc = await problem(response, 404)
        assert "no queue 'nope'" in doc["detail"] and "default" in doc["queues"]
    (row,) = [r for r in await QueueSettingsRepository(api.repo.pool).all() if r.name == "default"]
    assert row.overrides == {}
