"""GET /v1/jobs?key_prefix=... with many matches: each page looks at a bounded slice of ids,
newest first, returns the matches among them and a cursor to search older jobs
(`searched_ids`, `next_cursor`). Followed to the end, the pages hold every match once, in
order, however the matches are spread. The bounds are made small here (20 matches, slices of
50 ids) so that 400 jobs show every case; tests/db/test_search_plans.py checks the plan."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from dispatcher.db import job_reads
from tests.service.intake_app import Api, problem

JOBS = 400
# ids whose key starts with "acct-": old ones, one in the middle, a few recent ones
MATCHING = [*range(1, 61), 200, *range(380, 386)]


@pytest.fixture
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_reads, "PREFIX_SCAN_IDS", 20)
    monkeypatch.setattr(job_reads, "PREFIX_SLICE_IDS", 50)


async def seed(pool: asyncpg.Pool) -> None:
    """JOBS jobs with ids 1 to JOBS, keyed acct-<id> where MATCHING, else other-<id>; every
    third one dead."""
    await pool.execute(
        """
        INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state, due_at,
               max_attempts, max_retry_age_s, budget_started_at)
        SELECT CASE WHEN g = ANY($2::int[]) THEN 'acct-' ELSE 'other-' END || g, md5(g::text),
               'default', 'noop', '{}', CASE WHEN g % 3 = 0 THEN 'dead' ELSE 'succeeded' END,
               now(), 10, 86400, now()
          FROM generate_series(1, $1::int) g""",
        JOBS,
        MATCHING,
    )
    assert await pool.fetchval("SELECT max(id) FROM dispatcher.jobs") == JOBS


async def pages(api: Api, query: str) -> list[dict[str, Any]]:
    """Every page of the list, following next_cursor as a client does."""
    found: list[dict[str, Any]] = []
    cursor = ""
    while True:
        r = await api.client.get(f"/v1/jobs?{query}{cursor}")
        assert r.status == 200, await r.text()
        page = await r.json()
        found.append(page)
        if page["next_cursor"] is None:
            return found
        cursor = f"&cursor={page['next_cursor']}"


def ids(page: dict[str, Any]) -> list[int]:
    return [item["id"] for item in page["items"]]


@pytest.mark.usefixtures("small_bounds")
async def test_the_first_page_holds_the_matches_among_the_newest_ids_and_a_cursor_below_them(
    api: Api,
) -> None:
    await seed(api.repo.pool)
    r = await api.client.get("/v1/jobs?key_prefix=acct-&limit=10")
    assert r.status == 200, await r.text()
    page = await r.json()
    assert ids(page) == [385, 384, 383, 382, 381, 380]  # fewer than the limit: the slice ended
    assert page["searched_ids"] == {"oldest": 351, "newest": 400}
    assert page["next_cursor"] == "351"

    r = await api.client.get("/v1/jobs?key_prefix=acct-&limit=10&cursor=351")
    page = await r.json()
    assert (ids(page), page["searched_ids"], page["next_cursor"]) == (
        [],
        {"oldest": 301, "newest": 350},
        "301",
    )  # no match among them: an empty page that still goes on


@pytest.mark.usefixtures("small_bounds")
@pytest.mark.parametrize("limit", [1, 7, 10, 100])
async def test_following_the_cursors_finds_every_match_once_newest_first(
    api: Api, limit: int
) -> None:
    await seed(api.repo.pool)
    found = await pages(api, f"key_prefix=acct-&limit={limit}")
    listed = [i for page in found for i in ids(page)]
    assert listed == sorted(MATCHING, reverse=True)
    for page in found:  # a short page is the end, or a slice's end that says so
        if len(page["items"]) < limit and page["next_cursor"] is not None:
            assert page["next_cursor"] == str(page["searched_ids"]["oldest"])
    assert found[-1]["searched_ids"] is None


@pytest.mark.usefixtures("small_bounds")
async def test_the_slices_keep_the_other_filters(api: Api) -> None:
    await seed(api.repo.pool)
    found = await pages(api, "key_prefix=acct-&state=dead&limit=5")
    listed = [i for page in found for i in ids(page)]
    assert listed == sorted((n for n in MATCHING if n % 3 == 0), reverse=True)


@pytest.mark.usefixtures("small_bounds")
async def test_a_prefix_with_fewer_matches_than_the_bound_is_answered_whole(api: Api) -> None:
    """acct-5 matches 5 and 50 to 59 (11 keys, under 20): read from the index, no slices,
    however old."""
    await seed(api.repo.pool)
    (page,) = await pages(api, "key_prefix=acct-5&limit=100")
    assert ids(page) == [59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 5]
    assert page["searched_ids"] is None


@pytest.mark.usefixtures("small_bounds")
async def test_a_cursor_above_the_newest_job_searches_from_the_newest(api: Api) -> None:
    await seed(api.repo.pool)
    r = await api.client.get("/v1/jobs?key_prefix=acct-&limit=10&cursor=999999999")
    page = await r.json()
    assert (ids(page), page["searched_ids"]) == (
        [385, 384, 383, 382, 381, 380],
        {"oldest": 351, "newest": 400},
    )


@pytest.mark.parametrize("cursor", ["abc", "-5", "1.5", "9" * 19, "351x"])
async def test_a_cursor_that_no_page_gave_is_refused_with_its_name(api: Api, cursor: str) -> None:
    r = await api.client.get(f"/v1/jobs?key_prefix=acct-&cursor={cursor}")
    body = await problem(r, 422)
    assert body["detail"].startswith("cursor: pass the next_cursor of the previous page"), body
