"""A database outage leaves the repositories as `DatabaseUnavailable`, not as driver errors, and
fails a whole write group of single requests at once instead of retrying it item by item."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import create_pool
from dispatcher.db.runs import RunRepository
from dispatcher.errors import DatabaseUnavailable
from dispatcher.intake.accept import GroupWriter
from dispatcher.model import EnqueueResult, JobFilter, NewJob
from tests.outage_proxy import OutageProxy, outage_proxy

TARGET = {"url": "https://hooks.example.com/x"}


class CountingRepository(JobRepository):
    """Counts the writes a GroupWriter makes."""

    writes = 0

    async def enqueue_many(
        self, items: Sequence[NewJob], conn: asyncpg.Connection | None = None
    ) -> list[EnqueueResult]:
        self.writes += 1
        return await super().enqueue_many(items, conn)


@pytest.fixture
async def proxy(db_url: str) -> AsyncIterator[OutageProxy]:
    async with outage_proxy(db_url) as running:
        yield running


@pytest.fixture
async def proxied_pool(proxy: OutageProxy) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(proxy.url, size=4)
    yield pool
    pool.terminate()


def job(key: str) -> NewJob:
    return NewJob(key=key, handler="http", payload={}, target=TARGET)


async def test_an_outage_fails_every_waiting_single_request_at_once(
    proxy: OutageProxy, proxied_pool: asyncpg.Pool
) -> None:
    repo = CountingRepository(proxied_pool)
    writer = GroupWriter(repo)
    assert (await writer.submit(job("before"))).outcome == "created"

    await proxy.cut()
    repo.writes = 0
    async with asyncio.timeout(10):
        results = await asyncio.gather(
            *(writer.submit(job(f"during-{i}")) for i in range(50)), return_exceptions=True
        )
    assert all(isinstance(r, DatabaseUnavailable) for r in results), results[:3]
    assert "database unavailable" in str(results[0])
    assert repo.writes <= 3, f"{repo.writes} writes: the groups were retried item by item"

    await proxy.restore()
    # the pool may hand out a connection the cut killed once more; then it reconnects
    async with asyncio.timeout(10):
        while True:
            try:
                assert (await writer.submit(job("after"))).outcome == "created"
                break
            except DatabaseUnavailable:
                await asyncio.sleep(0.05)


async def test_api_reads_and_operator_actions_raise_database_unavailable(
    proxy: OutageProxy, proxied_pool: asyncpg.Pool
) -> None:
    jobs, runs = (
        JobRepository(proxied_pool),
        RunRepository(proxied_pool, JobRepository(proxied_pool)),
    )
    await proxy.cut()
    calls = {
        "get": lambda: jobs.get(1),
        "get_by_key": lambda: jobs.get_by_key("k"),
        "list_summaries": lambda: jobs.list_summaries(JobFilter(), cursor=None, limit=10),
        "retry": lambda: jobs.retry(1),
        "cancel": lambda: jobs.cancel(1),
        "enqueue_many": lambda: jobs.enqueue_many([job("k")]),
        "runs.latest": lambda: runs.latest("nightly"),
        "runs.finish_runs": lambda: runs.finish_runs("nightly"),
        "runs.get_state": lambda: runs.get_state("nightly"),
        "runs.count_queued": lambda: runs.count_queued("nightly"),
        "runs.outstanding_missed": lambda: runs.outstanding_missed("nightly", 20),
        "runs.run_periods_between": lambda: runs.run_periods_between(
            "nightly", datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
        ),
    }
    for name, call in calls.items():
        with pytest.raises(DatabaseUnavailable) as info:
            async with asyncio.timeout(10):
                await call()
        assert isinstance(info.value.__cause__, OSError | asyncpg.PostgresConnectionError), name
