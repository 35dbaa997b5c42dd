"""The SQL door takes every contract the HTTP door takes (issue 23; migration 032): key modes
(`on_key`, `debounce_max_s`) at `dispatcher.enqueue` and per item of `dispatcher.enqueue_many`,
and the per-job contract (`timeout_s`, `expires_at`, `on_success`, `on_failure`) per item of
`enqueue_many`, checked and answered as HTTP answers them. A replacement replaces the whole
request: priority and concurrency key included, in the job and in its fingerprint."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.model import NewJob

HOOK = {"url": "https://hooks.example/done"}
OTHER_HOOK = {"url": "https://hooks.example/other"}

ONE = """SELECT dispatcher.enqueue(key => $1, handler => 'report',
             payload => $2::text::jsonb, due_at => $3, priority => $4, concurrency_key => $5,
             on_key => $6, debounce_max_s => $7)"""
MANY = """SELECT r.ord, r.id, r.state, r.outcome, r.due_at FROM dispatcher.enqueue_many(
              keys => $1::text[], handlers => $2::text[], payloads => $3::text[]::jsonb[],
              due_ats => $4::timestamptz[], priorities => $5::integer[],
              on_keys => $6::text[], debounce_max_s => $7::integer[], timeout_s => $8::float8[],
              expires_ats => $9::timestamptz[], on_success => $10::text[]::jsonb[],
              on_failure => $11::text[]::jsonb[]) r ORDER BY r.ord"""


@pytest.fixture(autouse=True)
async def registry(repo: JobRepository) -> None:
    await repo.sync_registry(
        {"default": (10, 86_400)},
        {"report": ("python", 1), "http": ("http", 1)},
        due_at_past_tolerance_s=300,
        max_timeout_s={"report": 60.0},
    )


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def one(conn: asyncpg.Connection, key: str, payload: dict[str, Any], **kw: Any) -> int:
    args = [kw.get(n) for n in ("due_at", "priority", "concurrency_key", "on_key", "debounce")]
    job_id: int = await conn.fetchval(ONE, key, json.dumps(payload), *args)
    return job_id


async def many(conn: asyncpg.Connection, items: list[dict[str, Any]]) -> list[asyncpg.Record]:
    def col(name: str, encode: Any = None) -> list[Any] | None:
        values = [i.get(name) for i in items]
        if encode is not None:
            values = [None if v is None else encode(v) for v in values]
        return values if any(v is not None for v in values) else None

    return await conn.fetch(
        MANY,
        [i["key"] for i in items],
        ["report"] * len(items),
        [json.dumps(i.get("payload", {})) for i in items],
        col("due_at"),
        col("priority"),
        col("on_key"),
        col("debounce_max_s"),
        col("timeout_s"),
        col("expires_at"),
        col("on_success", json.dumps),
        col("on_failure", json.dumps),
    )


async def stored(conn: asyncpg.Connection, job_id: int) -> asyncpg.Record:
    row = await conn.fetchrow(
        "SELECT i.payload, i.priority, i.concurrency_key, i.timeout_s, i.on_success,"
        " i.on_failure, i.request_hash, s.due_at, s.expires_at, s.has_callback,"
        " s.priority AS state_priority, s.concurrency_key AS state_key, s.state"
        " FROM dispatcher.intents i JOIN dispatcher.job_state s ON s.id = i.id WHERE i.id = $1",
        job_id,
    )
    assert row is not None
    return row


# --- dispatcher.enqueue: on_key ----------------------------------------------------------------


async def test_enqueue_replace_debounces_a_scheduled_job_priority_and_key_included(
    conn: asyncpg.Connection,
) -> None:
    first = await one(conn, "k", {"v": 1}, due_at=later(60))
    second = await one(
        conn, "k", {"v": 2}, due_at=later(600), priority=-5, concurrency_key="acct-9",
        on_key="replace",
    )  # fmt: skip
    assert second == first
    row = await stored(conn, first)
    assert json.loads(row["payload"]) == {"v": 2}
    assert (row["priority"], row["state_priority"]) == (-5, -5)
    assert (row["concurrency_key"], row["state_key"]) == ("acct-9", "acct-9")
    assert row["due_at"] > later(500)
    # the replacing request is now the job's request: sent again (even by reject), a replay
    again = await one(
        conn, "k", {"v": 2}, due_at=row["due_at"], priority=-5, concurrency_key="acct-9"
    )
    assert again == first
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 1


async def test_enqueue_keep_due_throttles_and_debounce_max_s_bounds_the_push_back(
    conn: asyncpg.Connection,
) -> None:
    first = await one(conn, "t", {"v": 1}, due_at=later(60))
    due = (await stored(conn, first))["due_at"]
    await one(conn, "t", {"v": 2}, due_at=later(900), on_key="keep_due")
    row = await stored(conn, first)
    assert (json.loads(row["payload"]), row["due_at"]) == ({"v": 2}, due)

    bounded = await one(conn, "d", {"v": 1}, due_at=later(10))
    await one(conn, "d", {"v": 2}, due_at=later(3600), on_key="replace", debounce=120)
    assert (await stored(conn, bounded))["due_at"] < later(125)


async def test_enqueue_never_replaces_a_job_already_ready_and_says_so(
    conn: asyncpg.Connection,
) -> None:
    job = await one(conn, "r", {"v": 1})  # due now: ready
    with pytest.raises(asyncpg.UniqueViolationError, match=f"names job {job}, which is ready"):
        await one(conn, "r", {"v": 2}, on_key="replace")
    assert json.loads((await stored(conn, job))["payload"]) == {"v": 1}
    with pytest.raises(asyncpg.UniqueViolationError, match="different request"):
        await one(conn, "r", {"v": 2})  # reject (the default) as before


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"on_key": "sometimes"}, "on_key 'sometimes' is not a key mode"),
        ({"on_key": "keep_due", "debounce": 10}, "debounce_max_s 10 needs on_key 'replace'"),
        ({"debounce": 10}, "debounce_max_s 10 needs on_key 'replace'"),
        ({"on_key": "replace", "debounce": -1}, "debounce_max_s -1 needs"),
    ],
)
async def test_enqueue_refuses_a_bad_key_mode_and_writes_nothing(
    conn: asyncpg.Connection, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
        await one(conn, "bad", {}, **kw)
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0


# --- dispatcher.enqueue_many: contracts and key modes per item --------------------------------


async def test_enqueue_many_stores_each_items_contract(conn: asyncpg.Connection) -> None:
    expires = later(3600)
    rows = await many(
        conn,
        [
            {"key": "a", "timeout_s": 30.0, "expires_at": expires, "on_success": HOOK},
            {"key": "b", "on_failure": HOOK},
            {"key": "c"},
        ],
    )
    assert [r["outcome"] for r in rows] == ["created"] * 3
    a, b, c = [await stored(conn, r["id"]) for r in rows]
    assert (a["timeout_s"], a["expires_at"], json.loads(a["on_success"])) == (30.0, expires, HOOK)
    assert (a["on_failure"], a["has_callback"]) == (None, True)
    assert (json.loads(b["on_failure"]), b["has_callback"], b["timeout_s"]) == (HOOK, True, None)
    assert (c["timeout_s"], c["expires_at"], c["has_callback"]) == (None, None, False)


async def test_enqueue_many_replay_with_another_contract_is_a_conflict(
    conn: asyncpg.Connection,
) -> None:
    [made] = await many(conn, [{"key": "a", "timeout_s": 30.0, "on_success": HOOK}])
    rows = await many(
        conn,
        [
            {"key": "a", "timeout_s": 30.0, "on_success": HOOK},
            {"key": "a", "timeout_s": 45.0, "on_success": HOOK},
            {"key": "a", "timeout_s": 30.0, "on_success": OTHER_HOOK},
            {"key": "a", "timeout_s": 30.0},
        ],
    )
    assert [r["outcome"] for r in rows] == ["existing", "conflict", "conflict", "conflict"]
    assert {r["id"] for r in rows} == {made["id"]}
    assert (await stored(conn, made["id"]))["timeout_s"] == 30.0


async def test_enqueue_many_key_modes_answer_replaced_and_not_replaced_per_item(
    conn: asyncpg.Connection,
) -> None:
    await many(conn, [{"key": "s", "due_at": later(60)}, {"key": "r"}])  # scheduled, ready
    rows = await many(
        conn,
        [
            {"key": "s", "payload": {"v": 2}, "due_at": later(600), "on_key": "replace",
             "priority": 7, "timeout_s": 20.0, "on_success": HOOK},
            {"key": "r", "payload": {"v": 2}, "on_key": "replace"},
            {"key": "new", "on_key": "replace"},
            {"key": "r", "payload": {"v": 3}},
        ],
    )  # fmt: skip
    assert [(r["outcome"], r["state"]) for r in rows] == [
        ("replaced", "scheduled"),
        ("not_replaced", "ready"),
        ("created", "ready"),
        ("conflict", "ready"),
    ]
    s = await stored(conn, rows[0]["id"])
    assert (json.loads(s["payload"]), s["priority"], s["state_priority"]) == ({"v": 2}, 7, 7)
    assert (s["timeout_s"], json.loads(s["on_success"]), s["has_callback"]) == (20.0, HOOK, True)
    assert json.loads((await stored(conn, rows[1]["id"]))["payload"]) == {}
    # the replacement is the job's request now: the same item again is a replay
    again = await many(
        conn,
        [{"key": "s", "payload": {"v": 2}, "due_at": s["due_at"], "priority": 7,
          "timeout_s": 20.0, "on_success": HOOK}],
    )  # fmt: skip
    assert [r["outcome"] for r in again] == ["existing"]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"on_key": "always"}, r"on_key 'always' \(item 2\) is not a key mode"),
        ({"debounce_max_s": 5}, r"debounce_max_s 5 \(item 2\) needs on_key 'replace'"),
        ({"timeout_s": 61.0}, r"timeout_s 61 \(item 2\) is not a deadline handler 'report'"),
        ({"timeout_s": 0.0}, r"timeout_s 0 \(item 2\)"),
        ({"expires_at": datetime(2020, 1, 1, tzinfo=UTC)}, r"expires_at .* \(item 2\) is not"),
        ({"due_at": later(600), "expires_at": later(300)}, r"\(item 2\) is not after the due"),
        ({"on_success": {"to": "x"}}, r"are targets \{\"url\": ...\} \(item 2\)"),
    ],
)
async def test_enqueue_many_refuses_a_bad_contract_naming_the_item_and_writes_nothing(
    conn: asyncpg.Connection, item: dict[str, Any], message: str
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
        await many(conn, [{"key": "fine"}, {"key": "bad", **item}])
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0


async def test_enqueue_many_refuses_contract_arrays_of_another_length(
    conn: asyncpg.Connection,
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match="every array must have 2"):
        await conn.fetch(
            "SELECT * FROM dispatcher.enqueue_many(ARRAY['a', 'b'], ARRAY['report', 'report'],"
            " ARRAY['{}', '{}']::jsonb[], timeout_s => ARRAY[1.0]::float8[])"
        )


async def test_old_call_shapes_still_work(conn: asyncpg.Connection) -> None:
    """Positional calls written for the signatures before migration 032."""
    job = await conn.fetchval(
        "SELECT dispatcher.enqueue('old', 'report', '{}'::jsonb, NULL, NULL, NULL, NULL, NULL,"
        " NULL, 3, NULL, 10.0, NULL, NULL, NULL)"
    )
    rows = await conn.fetch(
        "SELECT * FROM dispatcher.enqueue_many(ARRAY['old2'], ARRAY['report'],"
        " ARRAY['{}']::jsonb[], NULL, NULL, NULL, NULL, NULL, NULL, NULL, ARRAY[2], NULL)"
    )
    assert (await stored(conn, job))["priority"] == 3
    assert (await stored(conn, rows[0]["id"]))["priority"] == 2


# --- replace_scheduled through the daemon's door (HTTP) ------------------------------------------


async def test_a_replace_changes_the_fingerprint_with_priority_and_concurrency_key(
    repo: JobRepository,
) -> None:
    due = later(600)
    job = NewJob(key="p", handler="report", payload={"v": 1}, due_at=due)
    [made] = await repo.enqueue_many([job])
    asked = NewJob(
        key="p", handler="report", payload={"v": 1}, due_at=due, priority=9,
        concurrency_key="acct", on_key="replace",
    )  # fmt: skip
    [conflict] = await repo.enqueue_many([asked])
    assert conflict.outcome == "conflict"  # a different priority is a different request
    [replaced] = await repo.replace_scheduled([asked])
    assert replaced is not None and replaced.outcome == "replaced"
    row = await stored_of(repo, made.id)
    assert (row["priority"], row["state_priority"], row["state_key"]) == (9, 9, "acct")
    [replay] = await repo.enqueue_many([asked])
    assert replay.outcome == "existing"
    [old] = await repo.enqueue_many([job])
    assert old.outcome == "conflict"


async def stored_of(repo: JobRepository, job_id: int) -> asyncpg.Record:
    async with repo.pool.acquire() as c:
        return await stored(c, job_id)
