"""Concurrent single requests share one write; one that the database refuses fails alone."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.intake.accept import GroupWriter
from dispatcher.model import EnqueueResult, NewJob

TARGET = {"url": "https://hooks.example.com/x"}


async def test_a_refused_item_fails_alone_and_its_group_is_written_one_by_one(
    repo: JobRepository,
) -> None:
    writer = GroupWriter(repo)
    good = [NewJob(key=f"good-{i}", handler="http", payload={}, target=TARGET) for i in (1, 2)]
    # the database refuses an unknown handler (intake normally stops it earlier)
    bad = NewJob(key="bad", handler="no-such-handler", payload={})
    results = await asyncio.gather(
        writer.submit(good[0]), writer.submit(bad), writer.submit(good[1]), return_exceptions=True
    )
    first, refused, second = results
    assert isinstance(first, EnqueueResult) and isinstance(second, EnqueueResult)
    assert (first.outcome, second.outcome) == ("created", "created")
    assert isinstance(refused, asyncpg.PostgresError)
    assert "unknown handler" in str(refused)
    keys = {r["key"] for r in await repo.pool.fetch("SELECT key FROM dispatcher.jobs")}
    assert keys == {"good-1", "good-2"}


@pytest.mark.parametrize("n", [1, 40])
async def test_concurrent_submits_each_get_their_own_result(repo: JobRepository, n: int) -> None:
    writer = GroupWriter(repo)
    jobs = [NewJob(key=f"k-{i}", handler="http", payload={"i": i}, target=TARGET) for i in range(n)]
    results = await asyncio.gather(*(writer.submit(j) for j in jobs))
    assert [r.key for r in results] == [j.key for j in jobs]
    assert all(r.outcome == "created" for r in results)
