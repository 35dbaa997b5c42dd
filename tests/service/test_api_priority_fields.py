"""`priority` and `concurrency_key` at the HTTP doors (POST /v1/jobs, each item of
/v1/jobs/batch) and the SQL door (dispatcher.enqueue, dispatcher.enqueue_many): stored with the
job, shown in its views, refused with a clear error when out of range, of the wrong type or too
long (nothing stored), and part of the idempotency fingerprint (migration 023)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from tests.service.intake_app import Api, http_job, problem

BAD_FIELDS: list[tuple[str, dict[str, Any], str]] = [
    ("priority too low", {"priority": -101}, "priority: Input should be greater than or equal"),
    ("priority too high", {"priority": 101}, "priority: Input should be less than or equal"),
    ("priority as text", {"priority": "5"}, "priority: Input should be a valid integer"),
    ("priority as float", {"priority": 1.5}, "priority: Input should be a valid integer"),
    ("priority as bool", {"priority": True}, "priority: Input should be a valid integer"),
    ("key too long", {"concurrency_key": "k" * 201}, "concurrency_key: String should have at"),
    ("key empty", {"concurrency_key": ""}, "concurrency_key: String should have at least 1"),
    ("key a number", {"concurrency_key": 7}, "concurrency_key: Input should be a valid string"),
    ("key with NUL", {"concurrency_key": "a\x00b"}, "U+0000"),
]


async def stored(pool: asyncpg.Pool, key: str) -> tuple[int, str | None] | None:
    row = await pool.fetchrow(
        "SELECT s.priority, s.concurrency_key, i.priority AS ip, i.concurrency_key AS ik"
        " FROM dispatcher.intents i JOIN dispatcher.job_state s USING (id) WHERE i.key = $1",
        key,
    )
    if row is None:
        return None
    assert (row["priority"], row["concurrency_key"]) == (row["ip"], row["ik"])
    return row["priority"], row["concurrency_key"]


async def test_the_fields_are_stored_and_shown_with_their_defaults(api: Api) -> None:
    pool = api.repo.pool
    sent = {
        "plain": http_job(),
        "tenanted": http_job(tenant="acct-1"),
        "urgent": http_job(tenant="acct-1", priority=-10, concurrency_key="partner-9"),
        "no-key": http_job(tenant="acct-1", priority=100, concurrency_key=None),
    }
    for key, body in sent.items():
        r = await api.post_job(key, body)
        assert r.status == 202, await r.text()
    assert await stored(pool, "plain") == (0, None)  # no tenant: no key
    assert await stored(pool, "tenanted") == (0, "acct-1")  # the tenant by default
    assert await stored(pool, "urgent") == (-10, "partner-9")
    assert await stored(pool, "no-key") == (100, None)  # null: no key
    view = await (await api.client.get("/v1/jobs?key=urgent")).json()
    (item,) = view["items"]
    assert (item["priority"], item["concurrency_key"]) == (-10, "partner-9")
    full = await (await api.client.get(f"/v1/jobs/{item['id']}")).json()
    assert (full["priority"], full["concurrency_key"]) == (-10, "partner-9")


@pytest.mark.parametrize(("fields", "fragment"), [(f, m) for _, f, m in BAD_FIELDS])
async def test_a_bad_field_is_refused_naming_it_and_nothing_is_stored(
    api: Api, fields: dict[str, Any], fragment: str
) -> None:
    doc = await problem(await api.post_job("bad", http_job(**fields)), 422)
    assert fragment in doc["detail"], doc["detail"]
    r = await api.client.post(
        "/v1/jobs/batch",
        json={
            "jobs": [
                {"idempotency_key": "ok", **http_job()},
                {"idempotency_key": "bad", **http_job(**fields)},
            ]
        },
    )
    results = (await r.json())["results"]
    assert [x["status"] for x in results] == ["accepted", "rejected"]
    assert fragment in results[1]["error"], results[1]["error"]
    assert await stored(api.repo.pool, "bad") is None


async def test_a_batch_item_carries_its_own_fields(api: Api) -> None:
    r = await api.client.post(
        "/v1/jobs/batch",
        json={
            "jobs": [
                {"idempotency_key": "b-1", **http_job(priority=-3, tenant="t")},
                {"idempotency_key": "b-2", **http_job(tenant="t", concurrency_key=None)},
                {"idempotency_key": "b-3", **http_job(concurrency_key="k")},
            ]
        },
    )
    assert r.status == 200, await r.text()
    pool = api.repo.pool
    assert await stored(pool, "b-1") == (-3, "t")
    assert await stored(pool, "b-2") == (0, None)
    assert await stored(pool, "b-3") == (0, "k")


async def test_the_same_key_with_another_priority_or_key_is_a_different_request(
    api: Api,
) -> None:
    """Decided: the fields are part of the request (a retry must send what it sent first).
    Sending the default explicitly is the same request as leaving it out."""
    assert (await api.post_job("fp", http_job(tenant="t"))).status == 202
    for same in (http_job(tenant="t", priority=0), http_job(tenant="t", concurrency_key="t")):
        r = await api.post_job("fp", same)
        assert r.status == 202, await r.text()
        assert r.headers["Idempotent-Replayed"] == "true"
    for other in (
        http_job(tenant="t", priority=1),
        http_job(tenant="t", concurrency_key="other"),
        http_job(tenant="t", concurrency_key=None),
    ):
        await problem(await api.post_job("fp", other), 409)
    assert await stored(api.repo.pool, "fp") == (0, "t")


# the SQL door ---------------------------------------------------------------------------------
async def sql_enqueue(pool: asyncpg.Pool, key: str, extra: str) -> Any:
    return await pool.fetchval(
        f"SELECT dispatcher.enqueue('{key}', 'http', '{{}}', target => "
        f"""'{{"url": "https://example.com/x"}}'{extra})"""
    )


async def test_the_sql_door_takes_the_fields_by_name(api: Api) -> None:
    pool = api.repo.pool
    await sql_enqueue(pool, "s-1", ", tenant => 'acct', priority => -10")
    await sql_enqueue(pool, "s-2", ", tenant => 'acct', concurrency_key => ''")
    await sql_enqueue(pool, "s-3", ", concurrency_key => 'partner'")
    assert await stored(pool, "s-1") == (-10, "acct")
    assert await stored(pool, "s-2") == (0, None)  # '' at the SQL door: no key
    assert await stored(pool, "s-3") == (0, "partner")
    await pool.execute("""
        SELECT count(*) FROM dispatcher.enqueue_many(
               ARRAY['m-1', 'm-2'], ARRAY['http', 'http'], ARRAY['{}', '{}']::jsonb[],
               tenants => ARRAY['a', 'b'],
               targets => ARRAY['{"url": "https://example.com/x"}',
                                '{"url": "https://example.com/x"}']::jsonb[],
               priorities => ARRAY[5, NULL], concurrency_keys => ARRAY[NULL, 'kb'])""")
    assert await stored(pool, "m-1") == (5, "a")
    assert await stored(pool, "m-2") == (0, "kb")
    # the same key with another priority is refused (the fingerprint covers it)
    with pytest.raises(asyncpg.UniqueViolationError, match="different request"):
        await sql_enqueue(pool, "s-1", ", tenant => 'acct', priority => -9")
    assert await sql_enqueue(pool, "s-1", ", tenant => 'acct', priority => -10") is not None


@pytest.mark.parametrize(
    ("extra", "message", "hint"),
    [
        (", priority => 101", "priority 101 is out of range", "from -100 to 100"),
        (", priority => -1000", "priority -1000 is out of range", "from -100 to 100"),
        (", concurrency_key => repeat('k', 201)", "concurrency_key is 201 characters", "1 to 200"),
    ],
)
async def test_the_sql_door_refuses_bad_fields_with_a_hint(
    api: Api, extra: str, message: str, hint: str
) -> None:
    pool = api.repo.pool
    with pytest.raises(asyncpg.InvalidParameterValueError, match=message) as one:
        await sql_enqueue(pool, "bad-1", extra)
    assert hint in (one.value.hint or "")
    many = extra.replace(", priority => ", ", priorities => ARRAY[1, ").replace(
        ", concurrency_key => ", ", concurrency_keys => ARRAY['ok', "
    )
    with pytest.raises(asyncpg.InvalidParameterValueError, match=message) as batch:
        await pool.execute(f"""
            SELECT count(*) FROM dispatcher.enqueue_many(
                   ARRAY['bad-2', 'bad-3'], ARRAY['http', 'http'], ARRAY['{{}}', '{{}}']::jsonb[],
                   targets => ARRAY['{{"url": "https://example.com/x"}}',
                                    '{{"url": "https://example.com/x"}}']::jsonb[]{many}])""")
    assert hint in (batch.value.hint or "")
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.intents") == 0
