"""Invariant 8, memory: the worst request mix the API allows keeps the daemon under 250 MB
resident. Stored jobs carry targets and payloads near the body limit; 8 clients list them 1,000
at a time, 8 read single jobs, and 8 post batches of large distinct targets (which fill the
intake's target cache). A real daemon process; its RSS is sampled throughout with psutil."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import asyncpg
import psutil

from tests.harness import LOOPBACK_ENV
from tests.harness.fixtures import Spawn

RSS_LIMIT_BYTES = 250 * 1024 * 1024
BODY_LIMIT_BYTES = 256 * 1024
STORED_JOBS = 1000
CLIENTS = 8
LIST_ROUNDS = 3
BATCHES = 600
LOAD_DEADLINE_S = 40.0
PAST = "2000-01-01T00:00:00Z"


def padded_headers(marker: str, count: int, chars: int = 8000) -> dict[str, str]:
    """`count` distinct target headers of `chars` characters (8,192 is the most one may hold)."""
    return {f"X-Pad-{n}": f"{marker}-{n}-".ljust(chars, "v") for n in range(count)}


async def seed_large_jobs(db_url: str) -> None:
    """STORED_JOBS dead jobs whose target and payload fill the body limit (~240 kB a row)."""
    target = {"url": "http://127.0.0.1:9/hook", "headers": padded_headers("t", 12)}
    payload = {"pad": "p" * 140_000}
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            """
            INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, target, payload,
                                         state, due_at, attempt, max_attempts, max_retry_age_s,
                                         budget_started_at, last_error, dead_reason, finished_at)
            SELECT 'big-' || i, 'seeded', 'default', 'http', $1::jsonb, $2::jsonb,
                   'dead', now(), 3, 3, 86400, now(), repeat('e', 50000), 'max_attempts', now()
              FROM generate_series(1, $3::int) AS i
            """,
            json.dumps(target),
            json.dumps(payload),
            STORED_JOBS,
        )
    finally:
        await conn.close()


def batch_body(n: int) -> bytes:
    """One batch near the body limit with distinct targets: a huge one, medium ones or small
    ones by turn. Due in the past, so every item is refused after its target is validated:
    the cache fills, the jobs table does not."""
    shape = n % 3
    if shape == 0:
        targets = [padded_headers(f"b{n}", 28)]
    elif shape == 1:
        targets = [padded_headers(f"b{n}-{i}", 2) for i in range(14)]
    else:
        targets = [padded_headers(f"b{n}-{i}", 1, chars=1000) for i in range(200)]
    jobs = [
        {
            "idempotency_key": f"cache-{n}-{i}",
            "handler": "http",
            "target": {"url": "http://127.0.0.1:9/hook", "headers": headers},
            "due_at": PAST,
        }
        for i, headers in enumerate(targets)
    ]
    body = json.dumps({"jobs": jobs}).encode()
    assert len(body) <= BODY_LIMIT_BYTES, len(body)
    return body


class PeakRss:
    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.peak = 0

    async def watch(self, limit: int) -> None:
        """Sample until stopped; return early once `limit` is passed (no need to go on)."""
        while True:
            rss = self.process.memory_info().rss
            self.peak = max(self.peak, rss)
            if rss > limit:
                return
            await asyncio.sleep(0.01)


async def worst_mix(base_url: str) -> dict[str, int]:
    counts = {"lists": 0, "gets": 0, "batches": 0}
    timeout = aiohttp.ClientTimeout(total=LOAD_DEADLINE_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as s:

        async def lister() -> None:
            for _ in range(LIST_ROUNDS):
                async with s.get(f"{base_url}/v1/jobs?limit=1000") as r:
                    body: dict[str, Any] = await r.json()
                    assert r.status == 200, body
                    assert len(body["items"]) == STORED_JOBS
                counts["lists"] += 1

        async def getter(client: int) -> None:
            for n in range(20):
                job_id = 1 + (client * 20 + n) % STORED_JOBS
                async with s.get(f"{base_url}/v1/jobs/{job_id}") as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                counts["gets"] += 1

        async def poster(client: int) -> None:
            for n in range(client, BATCHES, CLIENTS):
                async with s.post(
                    f"{base_url}/v1/jobs/batch",
                    data=batch_body(n),
                    headers={"Content-Type": "application/json"},
                ) as r:
                    results = (await r.json())["results"]
                    assert r.status == 200, results
                    assert {x["status"] for x in results} == {"rejected"}, results[0]
                counts["batches"] += 1

        await asyncio.gather(
            *(lister() for _ in range(CLIENTS)),
            *(getter(c) for c in range(CLIENTS)),
            *(poster(c) for c in range(CLIENTS)),
        )
    return counts


async def test_worst_request_mix_stays_under_the_memory_bound(db_url: str, spawn: Spawn) -> None:
    await seed_large_jobs(db_url)
    daemon = await spawn(
        {
            "DISPATCHER_DATABASE_URL": db_url,
            "DISPATCHER_BODY_LIMIT_BYTES": str(BODY_LIMIT_BYTES),
            **LOOPBACK_ENV,  # with a 0.2 s scan
        }
    )
    try:
        assert daemon.proc is not None
        rss = PeakRss(daemon.proc.pid)
        idle = rss.process.memory_info().rss
        started = time.monotonic()
        load = asyncio.create_task(worst_mix(daemon.base_url))
        watch = asyncio.create_task(rss.watch(RSS_LIMIT_BYTES))
        done, _ = await asyncio.wait(
            {load, watch}, timeout=LOAD_DEADLINE_S, return_when=asyncio.FIRST_COMPLETED
        )
        elapsed = time.monotonic() - started
        for task in (load, watch):
            task.cancel()
        await asyncio.gather(load, watch, return_exceptions=True)
        print(
            f"\nworst mix: idle {idle / 2**20:.0f} MB, peak {rss.peak / 2**20:.0f} MB "
            f"after {elapsed:.1f} s"
            + (f"; {load.result()}" if load in done else " (stopped early)")
        )
        assert rss.peak < RSS_LIMIT_BYTES, f"peak RSS {rss.peak / 2**20:.0f} MB"
        assert load in done, f"the request mix did not finish within {LOAD_DEADLINE_S:.0f} s"
        load.result()
    finally:
        if daemon.proc is not None and daemon.proc.returncode is None:
            daemon.proc.kill()
            await daemon.proc.wait()
