"""The console's overview at 10 million jobs: how long the server takes to render it.

A database filled with N jobs (default 10 million) the way a busy installation has them: 90 %
succeeded, 5 % scheduled in the future, 3 % dead (three reasons), 1 % cancelled, 1 % ready with
their outbox rows (a 100,000-job backlog at 10 million), over three queues. A daemon runs on it
(in process, no tokens: the open console), and the overview is fetched over loopback:

- the first render (cold: the sampler counts or estimates jobs per state for the first time),
- renders 1.1 s apart (each takes a fresh sample of ages and overdue counts: the worst case for
  a page that refreshes itself; the job counts are re-estimated on their own cadence),
- the live refresh (live.json) and the dead-letter page the same way.

Not a timed test: it prints figures. The target is 200 ms server time for the overview.

    .venv/bin/python -m tests.bench.bench_console [--rows 10000000] [--renders 20] [--keep]

`--keep` keeps the filled database (bench_console_<rows>) for the next run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import aiohttp
import asyncpg

from tests.harness import make_settings, running_daemon

QUEUES = ("default", "emails", "reports")
CHUNK = 500_000
SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

FILL = """
INSERT INTO dispatcher.jobs (key, request_hash, queue, tenant, handler, payload, state, due_at,
                             max_attempts, max_retry_age_s, budget_started_at, finished_at,
                             dead_reason, last_error, created_at)
SELECT 'bench-' || g, md5(g::text), (ARRAY['default','emails','reports'])[1 + g % 3],
       'tenant-' || (g % 1000), 'http', jsonb_build_object('n', g), s.state,
       CASE WHEN s.state = 'scheduled' THEN now() + interval '30 days'
            ELSE now() - interval '1 day' END,
       10, 86400, now() - interval '1 day',
       CASE WHEN s.state IN ('succeeded', 'dead', 'cancelled')
            THEN now() - make_interval(secs => g % 86400) END,
       CASE WHEN s.state = 'dead'
            THEN (ARRAY['http_4xx', 'attempts_exhausted', 'timeout'])[1 + g % 3] END,
       CASE WHEN s.state = 'dead' THEN 'HTTP 400: no such grant' END,
       now() - interval '1 day'
  FROM generate_series($1::bigint, $2::bigint) g
 CROSS JOIN LATERAL (SELECT CASE
       WHEN g % 100 < 90 THEN 'succeeded' WHEN g % 100 < 95 THEN 'scheduled'
       WHEN g % 100 < 98 THEN 'dead' WHEN g % 100 < 99 THEN 'cancelled' ELSE 'ready' END AS state) s
"""
# The backlog waits in paused queues: the daemon measured serves pages, it does not drain them.
PAUSED = """
INSERT INTO dispatcher.queues (name, max_attempts, max_retry_age_s, paused, paused_at)
SELECT q, 10, 86400, true, now() FROM unnest($1::text[]) q
    ON CONFLICT (name) DO UPDATE SET paused = true, paused_at = now()
"""
OUTBOX = """
INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability, created_at)
SELECT id, queue, tenant, 'http:1', now() - interval '10 minutes'
  FROM dispatcher.jobs WHERE state = 'ready'
"""


async def ensure_database(rows: int, keep: bool) -> str:
    name = f"bench_console_{rows}"
    admin = await asyncpg.connect(SERVER)
    exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
    if exists and keep:
        await admin.close()
        print(f"reusing {name}")
        return SERVER.rsplit("/", 1)[0] + f"/{name}"
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = SERVER.rsplit("/", 1)[0] + f"/{name}"
    from dispatcher.db import schema
    from dispatcher.db.pool import connect

    conn = await connect(url)
    await schema.migrate(conn)
    started = time.monotonic()
    for first in range(1, rows + 1, CHUNK):
        await conn.execute(FILL, first, min(rows, first + CHUNK - 1))
        print(
            f"  {min(rows, first + CHUNK - 1):,} rows, {time.monotonic() - started:.0f} s",
            flush=True,
        )
    await conn.execute(OUTBOX)
    await conn.execute(PAUSED, list(QUEUES))
    await conn.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.outbox")
    await conn.execute("CHECKPOINT")
    await conn.close()
    return url


async def timed(client: aiohttp.ClientSession, url: str) -> float:
    started = time.perf_counter()
    async with client.get(url) as r:
        await r.read()
        assert r.status == 200, r.status
    return (time.perf_counter() - started) * 1000


def describe(name: str, times: list[float]) -> None:
    times = sorted(times)
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    median = statistics.median(times)
    print(f"{name:<34} median {median:7.1f} ms   p95 {p95:7.1f} ms   max {times[-1]:7.1f} ms")


async def main(args: argparse.Namespace) -> None:
    url = await ensure_database(args.rows, args.keep)
    settings = make_settings(url, queues={q: {} for q in QUEUES}, log_level="WARNING")
    async with running_daemon(settings) as daemon, aiohttp.ClientSession() as client:
        base = daemon.base_url
        print(f"\n{args.rows:,} jobs; {args.renders} renders each, 1.1 s apart (fresh samples)")
        first = await timed(client, base + "/console/")
        print(f"{'first overview (cold sample)':<34} {first:7.1f} ms")
        for name, path in (
            ("overview", "/console/"),
            ("live.json", "/console/live.json"),
            ("dead letters", "/console/dead"),
            ("job list (newest 25)", "/console/jobs"),
        ):
            times = []
            for _ in range(args.renders):
                await asyncio.sleep(1.1)
                times.append(await timed(client, base + path))
            describe(name, times)
    if not args.keep:
        admin = await asyncpg.connect(SERVER)
        await admin.execute(f'DROP DATABASE IF EXISTS "bench_console_{args.rows}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--keep", action="store_true")
    asyncio.run(main(parser.parse_args()))
