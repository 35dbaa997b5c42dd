"""dispatcher.client's SQL door on every driver it names, against real PostgreSQL: asyncpg,
psycopg 3 (sync and async), SQLAlchemy 2 (Session on psycopg, AsyncSession on asyncpg). On each,
the job commits or rolls back with the caller's own business write, the same key and request
give the same job, another request under the key is refused, and enqueue_many reports each
item's outcome in order."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from dispatcher.client import SqlJob, enqueue, enqueue_many, enqueue_many_sync, enqueue_sync
from dispatcher.db.jobs import JobRepository

TARGET = {"url": "https://hooks.example.com/orders"}
LATER = datetime.now(UTC) + timedelta(days=1)


class Door:
    """One driver behind the same calls: a transaction that commits or rolls back, a business
    insert and the door's enqueue inside it. Sync drivers run in a thread."""

    def __init__(self, url: str, flavour: str) -> None:
        self.url, self.flavour = url, flavour

    @asynccontextmanager
    async def transaction(self, commit: bool) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        opener = getattr(self, f"_{self.flavour}")
        async with opener(commit) as run:
            yield run

    @asynccontextmanager
    async def _asyncpg(self, commit: bool) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        conn = await asyncpg.connect(self.url)
        tx = conn.transaction()
        await tx.start()

        async def run(action: str, *args: Any, **kw: Any) -> Any:
            if action == "insert":
                return await conn.execute("INSERT INTO orders VALUES ($1)", args[0])
            return await (enqueue if action == "one" else enqueue_many)(conn, *args, **kw)

        try:
            yield run
        finally:
            await (tx.commit() if commit else tx.rollback())
            await conn.close()

    @asynccontextmanager
    async def _psycopg_async(self, commit: bool) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(self.url)

        async def run(action: str, *args: Any, **kw: Any) -> Any:
            if action == "insert":
                return await conn.execute("INSERT INTO orders VALUES (%s)", (args[0],))
            return await (enqueue if action == "one" else enqueue_many)(conn, *args, **kw)

        try:
            yield run
        finally:
            await (conn.commit() if commit else conn.rollback())
            await conn.close()

    @asynccontextmanager
    async def _psycopg(self, commit: bool) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        import asyncio

        import psycopg

        conn = await asyncio.to_thread(psycopg.connect, self.url)

        def call(action: str, *args: Any, **kw: Any) -> Any:
            if action == "insert":
                return conn.execute("INSERT INTO orders VALUES (%s)", (args[0],))
            return (enqueue_sync if action == "one" else enqueue_many_sync)(conn, *args, **kw)

        async def run(action: str, *args: Any, **kw: Any) -> Any:
            return await asyncio.to_thread(call, action, *args, **kw)

        try:
            yield run
        finally:
            await asyncio.to_thread(conn.commit if commit else conn.rollback)
            await asyncio.to_thread(conn.close)

    @asynccontextmanager
    async def _sqlalchemy(self, commit: bool) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        import asyncio

        from sqlalchemy import create_engine, text
        from sqlalchemy.orm import Session

        engine = create_engine(self.url.replace("postgresql://", "postgresql+psycopg://", 1))
        session = Session(engine)

        def call(action: str, *args: Any, **kw: Any) -> Any:
            if action == "insert":
                return session.execute(text("INSERT INTO orders VALUES (:id)"), {"id": args[0]})
            return (enqueue_sync if action == "one" else enqueue_many_sync)(session, *args, **kw)

        async def run(action: str, *args: Any, **kw: Any) -> Any:
            return await asyncio.to_thread(call, action, *args, **kw)

        try:
            yield run
        finally:
            await asyncio.to_thread(session.commit if commit else session.rollback)
            await asyncio.to_thread(session.close)
            await asyncio.to_thread(engine.dispose)

    @asynccontextmanager
    async def _sqlalchemy_async(self, commit: bool) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        engine = create_async_engine(self.url.replace("postgresql://", "postgresql+asyncpg://", 1))
        session = AsyncSession(engine)

        async def run(action: str, *args: Any, **kw: Any) -> Any:
            if action == "insert":
                return await session.execute(
                    text("INSERT INTO orders VALUES (:id)"), {"id": args[0]}
                )
            return await (enqueue if action == "one" else enqueue_many)(session, *args, **kw)

        try:
            yield run
        finally:
            await (session.commit() if commit else session.rollback())
            await session.close()
            await engine.dispose()


FLAVOURS = ["asyncpg", "psycopg_async", "psycopg", "sqlalchemy", "sqlalchemy_async"]


@pytest.fixture(params=FLAVOURS)
async def door(request: pytest.FixtureRequest, db_url: str) -> Door:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    finally:
        await conn.close()
    return Door(db_url, request.param)


async def counts(url: str) -> tuple[int, int]:
    conn = await asyncpg.connect(url)
    try:
        orders = await conn.fetchval("SELECT count(*) FROM orders")
        jobs = await conn.fetchval("SELECT count(*) FROM dispatcher.jobs")
        return orders, jobs
    finally:
        await conn.close()


def job(key: str, n: int = 1) -> SqlJob:
    return SqlJob(key, "http", {"order": n}, due_at=LATER, target=TARGET, tenant="shop-1")


async def test_the_job_rolls_back_with_the_business_write(door: Door) -> None:
    async with door.transaction(commit=False) as run:
        await run("insert", 1)
        job_id = await run("one", "order-1", "http", {"order": 1}, target=TARGET)
        assert job_id > 0
    assert await counts(door.url) == (0, 0)


async def test_the_job_commits_with_the_business_write_and_a_replay_is_the_same_job(
    door: Door,
) -> None:
    one = job("order-1")
    fields = {"due_at": one.due_at, "target": TARGET, "tenant": "shop-1", "max_attempts": 4}
    async with door.transaction(commit=True) as run:
        await run("insert", 1)
        first = await run("one", one.key, one.handler, one.payload, **fields)
        again = await run("one", one.key, one.handler, one.payload, **fields)
    assert first == again
    assert await counts(door.url) == (1, 1)
    conn = await asyncpg.connect(door.url)
    try:
        row = await conn.fetchrow(
            "SELECT key, state, tenant, max_attempts, due_at FROM dispatcher.jobs WHERE id = $1",
            first,
        )
    finally:
        await conn.close()
    assert dict(row) == {
        "key": "order-1",
        "state": "scheduled",
        "tenant": "shop-1",
        "max_attempts": 4,
        "due_at": LATER,
    }


async def test_the_same_key_with_another_request_is_refused(door: Door) -> None:
    async with door.transaction(commit=True) as run:
        await run("one", "order-1", "http", {"order": 1}, target=TARGET)
    with pytest.raises(Exception) as refused:
        async with door.transaction(commit=False) as run:
            await run("one", "order-1", "http", {"order": 2}, target=TARGET)
    assert (
        "23505" in repr(refused.value)
        or "unique" in str(refused.value).lower()
        or ("UniqueViolation" in type(refused.value).__name__)
    ), repr(refused.value)


async def test_enqueue_many_reports_each_item_in_order(door: Door) -> None:
    async with door.transaction(commit=True) as run:
        await run(
            "one", "order-2", "http", {"order": 2}, due_at=LATER, target=TARGET, tenant="shop-1"
        )
        results = await run("many", [job("order-1"), job("order-2", 2), job("order-3", 3)])
    assert [(r.key, r.outcome, r.state) for r in results] == [
        ("order-1", "created", "scheduled"),
        ("order-2", "existing", "scheduled"),
        ("order-3", "created", "scheduled"),
    ]
    assert await counts(door.url) == (0, 3)


async def test_an_invalid_item_enqueues_none_of_them(door: Door) -> None:
    with pytest.raises(Exception) as refused:
        async with door.transaction(commit=True) as run:
            await run("many", [job("good"), SqlJob("bad", "http", {})])  # no target
    assert "target" in str(refused.value)
    assert await counts(door.url) == (0, 0)


async def test_a_wrong_object_or_flavour_is_a_clear_type_error(db_url: str) -> None:
    with pytest.raises(TypeError, match="asyncpg connection, a psycopg 3"):
        await enqueue(object(), "k", "http")
    conn = await asyncpg.connect(db_url)
    try:
        with pytest.raises(TypeError, match=r"use `await enqueue\(...\)`"):
            enqueue_sync(conn, "k", "http")
    finally:
        await conn.close()
    import psycopg

    with psycopg.connect(db_url) as sync_conn, pytest.raises(TypeError, match="enqueue_sync"):
        await enqueue(sync_conn, "k", "http")
    with pytest.raises(ValueError, match="needs a timezone"):
        await enqueue(object(), "k", "http", due_at=datetime(2030, 1, 1))


async def test_priority_and_concurrency_key_reach_the_job_on_every_driver(door: Door) -> None:
    async with door.transaction(commit=True) as run:
        await run("one", "p-1", "http", {}, target=TARGET, tenant="t", priority=-10)
        await run("one", "p-2", "http", {}, target=TARGET, tenant="t", concurrency_key="")
        await run(
            "many",
            [
                SqlJob("p-3", "http", {}, target=TARGET, priority=7, concurrency_key="acct-3"),
                SqlJob("p-4", "http", {}, target=TARGET, tenant="u"),
            ],
        )
    conn = await asyncpg.connect(door.url)
    try:
        rows = await conn.fetch(
            "SELECT key, priority, concurrency_key FROM dispatcher.jobs ORDER BY key"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [
        ("p-1", -10, "t"),  # the tenant by default
        ("p-2", 0, None),  # "": no key
        ("p-3", 7, "acct-3"),
        ("p-4", 0, "u"),
    ]


@pytest.fixture
async def work(repo: JobRepository) -> None:
    """A Python handler whose jobs may ask for a deadline of up to 60 s."""
    await repo.sync_registry(
        {"default": (10, 86_400)},
        {"work": ("python", 1), "http": ("http", 1)},
        max_timeout_s={"work": 60.0},
    )


@pytest.mark.usefixtures("work")
async def test_the_contract_and_key_modes_reach_the_job_on_every_driver(door: Door) -> None:
    hook = {"url": "https://hooks.example.com/done"}
    expires = LATER + timedelta(hours=1)
    async with door.transaction(commit=True) as run:
        first = await run(
            "one", "c-1", "work", {"v": 1}, due_at=LATER, timeout_s=12.5, expires_at=expires,
            on_success=hook,
        )  # fmt: skip
        again = await run(
            "one", "c-1", "work", {"v": 2}, due_at=LATER, on_key="replace", debounce_max_s=3600,
            on_failure=hook,
        )  # fmt: skip
        results = await run(
            "many",
            [
                SqlJob("c-2", "work", {}, due_at=LATER, timeout_s=3.0, on_failure=hook),
                SqlJob("c-1", "work", {"v": 3}, due_at=LATER, on_key="keep_due", priority=4),
                SqlJob("c-1", "work", {"v": 4}, due_at=LATER),  # reject: another request
            ],
        )
    assert again == first
    assert [(r.key, r.outcome) for r in results] == [
        ("c-2", "created"),
        ("c-1", "replaced"),
        ("c-1", "conflict"),
    ]
    conn = await asyncpg.connect(door.url)
    try:
        rows = await conn.fetch(
            "SELECT i.key, i.payload::text, i.priority, i.timeout_s, i.on_success::text,"
            " i.on_failure::text, s.expires_at FROM dispatcher.intents i"
            " JOIN dispatcher.job_state s ON s.id = i.id ORDER BY i.key"
        )
    finally:
        await conn.close()
    hook_text = '{"url": "https://hooks.example.com/done"}'
    assert [tuple(r) for r in rows] == [
        # replaced twice: the last request whole (its contract has no callback on success)
        ("c-1", '{"v": 3}', 4, None, None, None, None),
        ("c-2", "{}", 0, 3.0, None, hook_text, None),
    ]


@pytest.mark.usefixtures("work")
async def test_a_bad_contract_is_refused_on_every_driver(door: Door) -> None:
    with pytest.raises(Exception) as refused:
        async with door.transaction(commit=True) as run:
            await run("many", [SqlJob("ok", "work", {}), SqlJob("bad", "work", {}, on_key="x")])
    assert "on_key 'x' (item 2) is not a key mode" in str(refused.value)
    assert await counts(door.url) == (0, 0)
