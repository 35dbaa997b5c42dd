"""Both doors of the HTTP API normalise an idempotency key alike. HTTP drops the spaces and tabs
around a header value, so a batch item's `idempotency_key` loses them too: " k " and "k" name
one job whichever door they come through, and a key that is nothing but blanks is refused by
both."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.intake_app import Api, http_job, problem


async def batch(api: Api, *keys: str) -> list[dict[str, Any]]:
    items = [{"idempotency_key": key, **http_job()} for key in keys]
    r = await api.client.post("/v1/jobs/batch", json={"jobs": items})
    assert r.status == 200, await r.text()
    return (await r.json())["results"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("first_door", ["header", "batch"])
async def test_a_key_with_surrounding_blanks_names_the_same_job_through_both_doors(
    api: Api, first_door: str
) -> None:
    if first_door == "header":
        r = await api.post_job(" k ", http_job())
        assert r.status == 202, await r.text()
        created = await r.json()
        assert r.headers.get("Idempotent-Replayed") is None
    else:
        (created,) = await batch(api, " k ")
        assert created["status"] == "accepted", created
    assert created["key"] == "k"

    results = await batch(api, " k ", "k", "\tk\t", "k ")
    assert [(r["status"], r["id"]) for r in results] == [("existing", created["id"])] * 4
    for key in (" k ", "k", "\tk"):
        r = await api.post_job(key, http_job())
        assert r.status == 202, await r.text()
        assert (await r.json())["id"] == created["id"]
        assert r.headers["Idempotent-Replayed"] == "true"
    assert await api.count() == 1


@pytest.mark.parametrize("blank", [" ", "\t", " \t "])
async def test_a_blank_key_is_refused_by_both_doors(api: Api, blank: str) -> None:
    doc = await problem(await api.post_job(blank, http_job()), 400)
    assert "1 to 255 printable ASCII" in doc["detail"]
    (result,) = await batch(api, blank)
    assert result["status"] == "rejected"
    assert "idempotency_key: 1 to 255 printable ASCII" in result["error"]
    assert await api.count() == 0


async def test_a_255_character_key_with_surrounding_blanks_is_accepted_by_both_doors(
    api: Api,
) -> None:
    key = "x" * 255
    r = await api.post_job(f" {key} ", http_job())
    assert r.status == 202, await r.text()
    (result,) = await batch(api, f" {key} ")
    assert (result["status"], result["key"]) == ("existing", key)
