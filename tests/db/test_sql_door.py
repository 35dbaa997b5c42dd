"""The SQL door `dispatcher.enqueue(...)` / `dispatcher.enqueue_many(...)` and its Python helper,
against real PostgreSQL: transactional with the caller, idempotent by key, strict about input."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from dispatcher import client
from dispatcher.db.jobs import JobRepository
from tests.harness import wait_until

# the registry a daemon writes at start, and the outbox rows of a relay transport
pytestmark = [
    pytest.mark.registry(
        {"default": (10, 86_400), "bulk": (3, 600)}, {"report": ("python", 1)}, ready_outbox=True
    ),
    pytest.mark.usefixtures("relay_transport"),
]

TARGET = {"url": "https://hooks.example.com/grants"}
DEADLINE_S = 10.0


async def jobs_and_outbox(conn: asyncpg.Connection) -> tuple[int, int]:
    jobs = await conn.fetchval("SELECT count(*) FROM dispatcher.jobs")
    outbox = await conn.fetchval("SELECT count(*) FROM dispatcher.outbox")
    return jobs, outbox


async def sql_enqueue(conn: asyncpg.Connection, key: str, **args: Any) -> int:
    """Call the SQL function directly, as any language would (jsonb passed as text)."""
    args.setdefault("handler", "http")
    if args["handler"] == "http":
        args.setdefault("target", TARGET)
    names = ", ".join(
        f"{name} => ${i}{'::text::jsonb' if name in ('payload', 'target') else ''}"
        for i, name in enumerate(args, start=2)
    )
    values = [
        json.dumps(v) if k in ("payload", "target") and v is not None else v
        for k, v in args.items()
    ]
    return await conn.fetchval(f"SELECT dispatcher.enqueue(key => $1, {names})", key, *values)


# transactions ---------------------------------------------------------------------------------
async def test_enqueue_rolled_back_with_the_callers_transaction_leaves_nothing(
    conn: asyncpg.Connection,
) -> None:
    await conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")

    class BusinessFailure(Exception):
        pass

    with pytest.raises(BusinessFailure):
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (1)")
            job_id = await sql_enqueue(conn, "order-1:confirm", payload={"order": 1})
            # inside the transaction the job and its outbox row exist...
            assert (
                await conn.fetchval("SELECT state FROM dispatcher.jobs WHERE id = $1", job_id)
                == "ready"
            )
            assert await jobs_and_outbox(conn) == (1, 1)
            raise BusinessFailure

    # ...and they vanish with the business change
    assert await conn.fetchval("SELECT count(*) FROM orders") == 0
    assert await jobs_and_outbox(conn) == (0, 0)


async def test_helper_enqueue_rolled_back_leaves_no_job_then_commit_keeps_it(
    conn: asyncpg.Connection,
) -> None:
    tx = conn.transaction()
    await tx.start()
    first = await client.enqueue(conn, "grant-7", "http", {"grant": 7}, target=TARGET)
    assert isinstance(first, int)
    await tx.rollback()
    assert await jobs_and_outbox(conn) == (0, 0)

    async with conn.transaction():
        kept = await client.enqueue(conn, "grant-7", "http", {"grant": 7}, target=TARGET)
    assert await jobs_and_outbox(conn) == (1, 1)
    assert await conn.fetchval("SELECT key FROM dispatcher.jobs WHERE id = $1", kept) == "grant-7"


async def test_committed_enqueue_due_now_is_ready_with_one_outbox_row(
    conn: asyncpg.Connection,
) -> None:
    async with conn.transaction():
        job_id = await sql_enqueue(conn, "now-1", payload={"n": 1})
    row = await conn.fetchrow(
        "SELECT state, queue, handler, payload::text, due_at <= now() AS due FROM dispatcher.jobs"
        " WHERE id = $1",
        job_id,
    )
    assert (row["state"], row["queue"], row["handler"], row["due"]) == (
        "ready",
        "default",
        "http",
        True,
    )
    assert json.loads(row["payload"]) == {"n": 1}
    outbox = await conn.fetch("SELECT job_id, queue, capability FROM dispatcher.outbox")
    assert [tuple(r) for r in outbox] == [(job_id, "default", "http:1")]


async def test_in_process_a_job_due_now_is_ready_without_an_outbox_row(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    await repo.sync_registry({}, {}, due_at_past_tolerance_s=300)  # an in-process daemon starts
    assert await conn.fetchval("SELECT ready_outbox FROM dispatcher.intake_settings") is False
    job_id = await sql_enqueue(conn, "in-process")
    many = await conn.fetchval(
        "SELECT count(*) FROM dispatcher.enqueue_many(ARRAY['a', 'b'], ARRAY['http', 'http'],"
        " ARRAY['{}', '{}']::jsonb[], NULL, NULL, NULL, ARRAY[$1, $1]::jsonb[])",
        json.dumps(TARGET),
    )
    assert many == 2
    states = await conn.fetch("SELECT id, state FROM dispatcher.jobs ORDER BY id")
    assert [r["state"] for r in states] == ["ready"] * 3 and states[0]["id"] == job_id
    assert await jobs_and_outbox(conn) == (3, 0)


async def test_committed_future_enqueue_is_scheduled_without_outbox_row(
    conn: asyncpg.Connection,
) -> None:
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)
    job_id = await sql_enqueue(conn, "later-1", due_at=due)
    row = await conn.fetchrow("SELECT state, due_at FROM dispatcher.jobs WHERE id = $1", job_id)
    assert row["state"] == "scheduled"
    assert row["due_at"] == due
    assert await jobs_and_outbox(conn) == (1, 0)


async def test_queue_defaults_apply_when_limits_are_omitted(
    conn: asyncpg.Connection, registry: None
) -> None:
    own = await sql_enqueue(conn, "bulk-own", queue="bulk", max_attempts=7, max_retry_age_s=60)
    defaulted = await sql_enqueue(conn, "bulk-default", queue="bulk")
    rows = {
        r["id"]: (r["max_attempts"], r["max_retry_age_s"])
        for r in await conn.fetch("SELECT id, max_attempts, max_retry_age_s FROM dispatcher.jobs")
    }
    assert rows == {own: (7, 60), defaulted: (3, 600)}


async def test_configured_handler_takes_no_target(conn: asyncpg.Connection, registry: None) -> None:
    job_id = await client.enqueue(conn, "report-2026-05", "report", {"month": "2026-05"})
    row = await conn.fetchrow("SELECT handler, target FROM dispatcher.jobs WHERE id = $1", job_id)
    assert (row["handler"], row["target"]) == ("report", None)
    with pytest.raises(asyncpg.InvalidParameterValueError, match="other handlers take no target"):
        await client.enqueue(conn, "report-x", "report", {}, target=TARGET)


async def test_configured_handler_refuses_any_target(
    conn: asyncpg.Connection, registry: None
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match="other handlers take no target"):
        await client.enqueue(conn, "report-y", "report", {}, target={"note": "no url"})


# idempotency ------------------------------------------------------------------------------------
async def test_same_key_and_same_arguments_return_the_same_job(conn: asyncpg.Connection) -> None:
    due = datetime.now(UTC) + timedelta(hours=1)
    first = await sql_enqueue(conn, "same-1", payload={"a": 1, "b": [1, 2]}, due_at=due)
    # the same payload with keys in another order is the same request (jsonb is canonical)
    second = await conn.fetchval(
        "SELECT dispatcher.enqueue('same-1', 'http', '{\"b\": [1, 2], \"a\": 1}'::jsonb, $1,"
        " target => $2::text::jsonb)",
        due,
        json.dumps(TARGET),
    )
    assert second == first
    assert await jobs_and_outbox(conn) == (1, 0)


@pytest.mark.parametrize(
    "changed",
    [
        {"payload": {"a": 2}},
        {"due_at": datetime(2099, 1, 1, tzinfo=UTC)},
        {"target": {"url": "https://other.example.com/"}},
        {"tenant": "property-17"},
        {"max_attempts": 3},
    ],
    ids=lambda c: next(iter(c)),
)
async def test_same_key_with_different_arguments_raises_a_clear_error(
    conn: asyncpg.Connection, changed: dict[str, Any]
) -> None:
    original = await sql_enqueue(conn, "order-9", payload={"a": 1})
    with pytest.raises(asyncpg.UniqueViolationError) as raised:
        await sql_enqueue(conn, "order-9", **{"payload": {"a": 1}, **changed})
    message = str(raised.value)
    assert "order-9" in message
    assert f"job {original}" in message
    assert "different request" in message
    assert "new key" in raised.value.hint
    assert await jobs_and_outbox(conn) == (1, 1)


async def test_helper_is_idempotent_and_raises_on_conflict(pool: asyncpg.Pool) -> None:
    # a pool connection has the dispatcher's jsonb codec; the helper must work there too
    async with pool.acquire() as conn:
        first = await client.enqueue(conn, "h-1", "http", {"x": 1}, target=TARGET, tenant="t1")
        again = await client.enqueue(conn, "h-1", "http", {"x": 1}, target=TARGET, tenant="t1")
        assert again == first
        with pytest.raises(asyncpg.UniqueViolationError, match="different request"):
            await client.enqueue(conn, "h-1", "http", {"x": 2}, target=TARGET, tenant="t1")
        row = await conn.fetchrow(
            "SELECT payload, tenant FROM dispatcher.jobs WHERE id = $1", first
        )
    assert (row["payload"], row["tenant"]) == ({"x": 1}, "t1")


async def test_helper_passes_every_argument(conn: asyncpg.Connection, registry: None) -> None:
    due = datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC)
    job_id = await client.enqueue(
        conn,
        "all-args",
        "http",
        {"deep": {"list": [1, "two", None]}},
        due_at=due,
        queue="bulk",
        tenant="property-17",
        target=TARGET,
        max_attempts=4,
        max_retry_age_s=120,
    )
    row = await conn.fetchrow(
        "SELECT payload::text, due_at, queue, tenant, target::text, max_attempts, max_retry_age_s,"
        " state FROM dispatcher.jobs WHERE id = $1",
        job_id,
    )
    assert json.loads(row["payload"]) == {"deep": {"list": [1, "two", None]}}
    assert json.loads(row["target"]) == TARGET
    assert (row["due_at"], row["queue"], row["tenant"]) == (due, "bulk", "property-17")
    assert (row["max_attempts"], row["max_retry_age_s"], row["state"]) == (4, 120, "scheduled")


async def test_helper_defaults_payload_to_an_empty_object(conn: asyncpg.Connection) -> None:
    job_id = await client.enqueue(conn, "empty", "http", target=TARGET)
    assert (
        await conn.fetchval("SELECT payload::text FROM dispatcher.jobs WHERE id = $1", job_id)
        == "{}"
    )


async def test_helper_refuses_a_naive_due_at(conn: asyncpg.Connection) -> None:
    with pytest.raises(ValueError, match="due_at needs a timezone"):
        await client.enqueue(conn, "naive", "http", target=TARGET, due_at=datetime(2031, 1, 1))
    assert await jobs_and_outbox(conn) == (0, 0)


async def wait_until_blocked(observer: asyncpg.Connection, pid: int) -> None:
    async def blocked() -> bool:
        sql = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
        return bool(await observer.fetchval(sql, pid))

    what = f"backend {pid} to block on the first transaction's key"
    await wait_until(blocked, timeout_s=DEADLINE_S, interval_s=0.01, what=what)


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
async def test_concurrent_enqueue_of_one_key_waits_for_the_first_transaction(
    db_url: str, first_commits: bool
) -> None:
    a, b, observer = [await asyncpg.connect(db_url) for _ in range(3)]
    try:
        tx = a.transaction()
        await tx.start()
        first = await client.enqueue(a, "race", "http", {"n": 1}, target=TARGET)
        second = asyncio.create_task(client.enqueue(b, "race", "http", {"n": 1}, target=TARGET))
        await wait_until_blocked(observer, b.get_server_pid())
        await (tx.commit() if first_commits else tx.rollback())
        second_id = await asyncio.wait_for(second, DEADLINE_S)
        ids = [r[0] for r in await observer.fetch("SELECT id FROM dispatcher.jobs")]
        if first_commits:
            assert second_id == first
        else:
            assert second_id != first  # the first never existed; the second created the job
        assert ids == [second_id]
        assert await jobs_and_outbox(observer) == (1, 1)
    finally:
        for c in (a, b, observer):
            await c.close()


# validation -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"handler": "nope"}, "unknown handler 'nope'"),
        ({"queue": "missing"}, "unknown queue 'missing'"),
        ({"payload": [1, 2]}, "payload must be a JSON object"),
        ({"payload": "text"}, "payload must be a JSON object"),
        ({"payload": 42}, "payload must be a JSON object"),
        ({"payload": None}, "payload must be a JSON object"),
        ({"target": None}, 'handler "http" needs target'),
        ({"target": {"method": "POST"}}, 'handler "http" needs target'),
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
        ({"max_retry_age_s": -1}, "max_retry_age_s >= 0"),
    ],
    ids=lambda v: (
        v if isinstance(v, str) else next(iter(v)) + "=" + json.dumps(next(iter(v.values())))
    ),
)
async def test_invalid_request_raises_22023_naming_the_problem(
    conn: asyncpg.Connection, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError) as raised:
        await sql_enqueue(conn, "valid-key", **args)
    assert raised.value.sqlstate == "22023"
    assert message in str(raised.value)
    assert await jobs_and_outbox(conn) == (0, 0)


@pytest.mark.parametrize(
    "key",
    ["", "x" * 256, "tab\there", "new\nline", "caf\u00e9"],
    ids=["empty", "256", "tab", "nl", "utf8"],
)
async def test_bad_key_raises_22023(conn: asyncpg.Connection, key: str) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match="invalid key") as raised:
        await client.enqueue(conn, key, "http", target=TARGET)
    assert "1 to 255 printable ASCII" in raised.value.hint
    assert await jobs_and_outbox(conn) == (0, 0)


async def test_longest_and_punctuated_keys_are_accepted(conn: asyncpg.Connection) -> None:
    for key in ("k" * 255, "tenant 17/run:2026-05-31T02:00Z#unit~9"):
        job_id = await client.enqueue(conn, key, "http", target=TARGET)
        assert await conn.fetchval("SELECT key FROM dispatcher.jobs WHERE id = $1", job_id) == key


async def test_unknown_handler_when_not_registered_then_accepted_once_registered(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match="unknown handler 'report'"):
        await client.enqueue(conn, "r-1", "report")
    await repo.sync_registry({"default": (10, 86_400)}, {"report": ("python", 1)})
    assert isinstance(await client.enqueue(conn, "r-1", "report"), int)


# enqueue_many -----------------------------------------------------------------------------------
ENQUEUE_MANY = """
SELECT ord, id, key, state, outcome FROM dispatcher.enqueue_many(
    $1::text[], $2::text[], $3::text[]::jsonb[], due_ats => $4::timestamptz[],
    targets => $5::text[]::jsonb[])
"""


async def test_enqueue_many_takes_1000_rows_in_one_call(conn: asyncpg.Connection) -> None:
    n = 1000
    keys = [f"grant-{i:04d}" for i in range(n)]
    future = datetime.now(UTC) + timedelta(hours=2)
    due = [None if i % 2 == 0 else future for i in range(n)]  # half due now, half later
    args = (
        keys,
        ["http"] * n,
        [json.dumps({"grant": i}) for i in range(n)],
        due,
        [json.dumps(TARGET)] * n,
    )

    rows = sorted(await conn.fetch(ENQUEUE_MANY, *args), key=lambda r: r["ord"])
    assert [r["ord"] for r in rows] == list(range(1, n + 1))
    assert [r["key"] for r in rows] == keys
    assert {r["outcome"] for r in rows} == {"created"}
    assert [r["state"] for r in rows] == ["ready" if i % 2 == 0 else "scheduled" for i in range(n)]
    assert len({r["id"] for r in rows}) == n
    assert await jobs_and_outbox(conn) == (n, n // 2)

    again = sorted(await conn.fetch(ENQUEUE_MANY, *args), key=lambda r: r["ord"])
    assert {r["outcome"] for r in again} == {"existing"}
    assert [r["id"] for r in again] == [r["id"] for r in rows]
    assert await jobs_and_outbox(conn) == (n, n // 2)


async def test_enqueue_many_resolves_duplicates_and_conflicts_within_one_call(
    conn: asyncpg.Connection,
) -> None:
    keys = ["a", "b", "a", "b"]
    payloads = [json.dumps(p) for p in ({"v": 1}, {"v": 1}, {"v": 1}, {"v": 2})]
    rows = await conn.fetch(
        ENQUEUE_MANY, keys, ["http"] * 4, payloads, None, [json.dumps(TARGET)] * 4
    )
    rows = sorted(rows, key=lambda r: r["ord"])  # `ord` gives the order; rows may come in any
    assert [(r["key"], r["outcome"]) for r in rows] == [
        ("a", "created"),
        ("b", "created"),
        ("a", "existing"),
        ("b", "conflict"),
    ]
    assert rows[2]["id"] == rows[0]["id"]
    assert rows[3]["id"] == rows[1]["id"]
    assert await jobs_and_outbox(conn) == (2, 2)


async def test_enqueue_many_refuses_arrays_of_different_lengths(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match="every array must have 2"):
        await conn.fetch(ENQUEUE_MANY, ["a", "b"], ["http"], ["{}", "{}"], None, None)


async def test_enqueue_many_with_one_bad_item_enqueues_nothing(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match="unknown handler 'nope'"):
        await conn.fetch(
            ENQUEUE_MANY,
            ["a", "b"],
            ["http", "nope"],
            ["{}", "{}"],
            None,
            [json.dumps(TARGET), None],
        )
    assert await jobs_and_outbox(conn) == (0, 0)


async def make_pre_005(conn: asyncpg.Connection, key: str) -> None:
    """Give a job the md5 fingerprint every job had before migration 005."""
    await conn.execute(
        """UPDATE dispatcher.jobs j
              SET request_hash = dispatcher.request_hash(j.handler, j.target, j.payload, j.queue,
                                                         j.tenant, $2, $3, NULL)
            WHERE key = $1""",
        key,
        None,
        None,
    )


async def test_fingerprints_are_version_2_and_tell_nested_shapes_apart(
    conn: asyncpg.Connection,
) -> None:
    await sql_enqueue(conn, "shape", payload={"ids": [5]})
    stored = await conn.fetchval("SELECT request_hash FROM dispatcher.jobs WHERE key = 'shape'")
    assert stored.startswith("v2:")
    with pytest.raises(asyncpg.UniqueViolationError):
        await sql_enqueue(conn, "shape", payload={"ids": 5})


@pytest.mark.parametrize("door", ["enqueue", "enqueue_many"])
async def test_a_job_accepted_before_migration_005_is_still_recognised(
    conn: asyncpg.Connection, door: str
) -> None:
    original = await sql_enqueue(conn, "old-1", payload={"a": 1})
    await make_pre_005(conn, "old-1")
    stored = await conn.fetchval("SELECT request_hash FROM dispatcher.jobs WHERE key = 'old-1'")
    assert len(stored) == 32 and not stored.startswith("v2:")

    async def again(payload: dict[str, Any]) -> tuple[int, str]:
        if door == "enqueue":
            return await sql_enqueue(conn, "old-1", payload=payload), "existing"
        row = await conn.fetchrow(
            "SELECT id, outcome FROM dispatcher.enqueue_many(ARRAY['old-1'], ARRAY['http'],"
            " ARRAY[$1::text::jsonb], targets => ARRAY[$2::text::jsonb])",
            json.dumps(payload),
            json.dumps(TARGET),
        )
        return row["id"], row["outcome"]

    assert await again({"a": 1}) == (original, "existing")
    if door == "enqueue":
        with pytest.raises(asyncpg.UniqueViolationError):
            await again({"a": 2})
    else:
        assert await again({"a": 2}) == (original, "conflict")
    assert await jobs_and_outbox(conn) == (1, 1)


# enqueue_many: what a batch answers is what it wrote (migration 018) ------------------------------
JOB_ROWS = "SELECT id, key, state, due_at, created_at FROM dispatcher.jobs ORDER BY id"


async def test_enqueue_many_answers_what_it_wrote_ids_in_item_order(
    conn: asyncpg.Connection,
) -> None:
    future = datetime.now(UTC) + timedelta(hours=1)
    keys = ["w-1", "w-2", "w-3"]
    rows = await conn.fetch(
        "SELECT * FROM dispatcher.enqueue_many($1::text[], ARRAY['http','http','http'],"
        " ARRAY['{}','{}','{}']::jsonb[], $2::timestamptz[], targets => $3::text[]::jsonb[])",
        keys,
        [None, future, None],
        [json.dumps(TARGET)] * 3,
    )
    answered = [
        (r["id"], r["key"], r["state"], r["due_at"], r["created_at"])
        for r in sorted(rows, key=lambda r: r["ord"])
    ]
    stored = [tuple(r) for r in await conn.fetch(JOB_ROWS)]
    assert answered == stored  # ids ascend in item order
    assert [s[2] for s in stored] == ["ready", "scheduled", "ready"]
    assert stored[1][3] == future
    assert {r["outcome"] for r in rows} == {"created"}


async def test_enqueue_many_mixes_new_existing_and_conflicting_keys(
    conn: asyncpg.Connection,
) -> None:
    first = await conn.fetch(
        ENQUEUE_MANY, ["m-a", "m-b"], ["http"] * 2, ['{"v": 1}'] * 2, None, [json.dumps(TARGET)] * 2
    )
    before = {r["key"]: r["id"] for r in first}
    keys = ["m-new", "m-a", "m-b", "m-new", "m-last"]
    payloads = ['{"v": 1}', '{"v": 1}', '{"v": 2}', '{"v": 3}', '{"v": 1}']
    rows = await conn.fetch(
        ENQUEUE_MANY, keys, ["http"] * 5, payloads, None, [json.dumps(TARGET)] * 5
    )
    rows = sorted(rows, key=lambda r: r["ord"])
    assert [(r["key"], r["outcome"]) for r in rows] == [
        ("m-new", "created"),
        ("m-a", "existing"),
        ("m-b", "conflict"),
        ("m-new", "conflict"),  # the first item of a key wins; this one asks for other work
        ("m-last", "created"),
    ]
    assert rows[1]["id"] == before["m-a"] and rows[2]["id"] == before["m-b"]
    assert rows[3]["id"] == rows[0]["id"]
    stored = {r["key"]: r for r in await conn.fetch(JOB_ROWS)}
    assert set(stored) == {"m-a", "m-b", "m-new", "m-last"}
    for r in rows:
        assert (r["id"], r["state"]) == (stored[r["key"]]["id"], stored[r["key"]]["state"])
    # every created job has its state row and, for a relay, its outbox row
    assert await jobs_and_outbox(conn) == (4, 4)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"key": ""}, "invalid key"),
        ({"key": "caf\u00e9"}, "invalid key"),
        ({"queue": "missing"}, "unknown queue 'missing'"),
        ({"payload": "[1]"}, "payload must be a JSON object"),
        ({"target": None}, 'handler "http" needs target'),
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
    ],
    ids=["empty-key", "utf8-key", "queue", "payload", "target", "attempts"],
)
async def test_enqueue_many_with_one_bad_item_after_an_existing_key_writes_nothing(
    conn: asyncpg.Connection, item: dict[str, Any], message: str
) -> None:
    await sql_enqueue(conn, "kept", payload={})
    bad = {
        "key": "bad",
        "queue": None,
        "payload": "{}",
        "target": json.dumps(TARGET),
        "max_attempts": None,
        **item,
    }
    with pytest.raises(asyncpg.InvalidParameterValueError, match=message) as raised:
        await conn.fetch(
            "SELECT * FROM dispatcher.enqueue_many($1::text[], ARRAY['http','http','http'],"
            " $2::text[]::jsonb[], queues => $3::text[], targets => $4::text[]::jsonb[],"
            " max_attempts => $5::integer[])",
            ["fresh", "kept", bad["key"]],
            ["{}", "{}", bad["payload"]],
            [None, None, bad["queue"]],
            [json.dumps(TARGET), json.dumps(TARGET), bad["target"]],
            [None, None, bad["max_attempts"]],
        )
    assert raised.value.sqlstate == "22023"
    assert [r["key"] for r in await conn.fetch(JOB_ROWS)] == ["kept"]
    assert await jobs_and_outbox(conn) == (1, 1)


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
async def test_concurrent_batches_sharing_a_key_resolve_it_once(
    db_url: str, first_commits: bool
) -> None:
    a, b, observer = [await asyncpg.connect(db_url) for _ in range(3)]
    targets = [json.dumps(TARGET)] * 2
    try:
        tx = a.transaction()
        await tx.start()
        await a.fetch(ENQUEUE_MANY, ["c-1", "c-2"], ["http"] * 2, ["{}"] * 2, None, targets)
        second = asyncio.create_task(
            b.fetch(ENQUEUE_MANY, ["c-2", "c-3"], ["http"] * 2, ["{}"] * 2, None, targets)
        )
        await wait_until_blocked(observer, b.get_server_pid())
        await (tx.commit() if first_commits else tx.rollback())
        rows = sorted(await asyncio.wait_for(second, DEADLINE_S), key=lambda r: r["ord"])
        shared = "existing" if first_commits else "created"
        assert [(r["key"], r["outcome"]) for r in rows] == [("c-2", shared), ("c-3", "created")]
        stored = {r["key"]: r["id"] for r in await observer.fetch(JOB_ROWS)}
        assert set(stored) == ({"c-1", "c-2", "c-3"} if first_commits else {"c-2", "c-3"})
        assert [r["id"] for r in rows] == [stored["c-2"], stored["c-3"]]
        assert await jobs_and_outbox(observer) == (len(stored), len(stored))
    finally:
        for c in (a, b, observer):
            await c.close()
