"""Debounce on real daemons: 50 concurrent replacements of one key, spread over two daemons on
one database, make one job; the last body wins and it runs once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg
import pytest

from dispatcher.core import rfc3339
from tests.harness import LOOPBACK_ENV, Target, serve_target, wait_until
from tests.harness.fixtures import Spawn

REPLACEMENTS = 50


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    async with serve_target(Target()) as t:
        yield t


async def test_fifty_concurrent_replacements_on_two_daemons_make_one_run_of_the_last_body(
    db_url: str, target: Target, spawn: Spawn
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV}
    daemons = await asyncio.gather(*(spawn(env) for _ in range(2)))
    due = ""

    def body(n: int) -> dict[str, object]:
        return {
            "handler": "http",
            "target": {"url": target.url},
            "payload": {"n": n},
            "due_at": due,
            "on_key": "replace",
        }

    try:
        # due after the replacements (a loaded machine included), so all of them find it scheduled
        due = rfc3339.format(datetime.now(UTC) + timedelta(seconds=10))
        async with aiohttp.ClientSession() as s:

            async def send(n: int) -> int:
                url = f"{daemons[n % 2].base_url}/v1/jobs"
                async with s.post(url, json=body(n), headers={"Idempotency-Key": "deb"}) as r:
                    return r.status

            statuses = await asyncio.gather(*(send(n) for n in range(REPLACEMENTS)))
            assert set(statuses) == {202}, statuses
            # the last replacement, after all the others answered, is the body that runs
            assert await send(REPLACEMENTS) == 202
        conn = await asyncpg.connect(db_url)
        try:
            rows = await conn.fetch("SELECT payload::text AS p FROM dispatcher.jobs")
            assert [r["p"] for r in rows] == [f'{{"n": {REPLACEMENTS}}}']

            async def succeeded() -> bool:
                return bool(await conn.fetchval("SELECT state = 'succeeded' FROM dispatcher.jobs"))

            await wait_until(succeeded, timeout_s=60, what="the debounced job to succeed")
        finally:
            await conn.close()
        deliveries = [r for r in target.requests if r["key"] == "deb"]
        assert len(deliveries) == 1, deliveries
        assert json.loads(deliveries[0]["body"]) == {"n": REPLACEMENTS}
    finally:
        for d in daemons:
            await d.stop()
