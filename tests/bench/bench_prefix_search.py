"""The job list's key-prefix search at 10 million jobs: the console's server time for prefixes
with few matches, with every key, and with many matches that are all old, on the first page
and on the page after it (the API's next_cursor: a "Search older jobs" link where the search
looks at a slice of the ids, else the next page).

The database is bench_console's (tests/bench/bench_console.py, kept with --keep): keys
`bench-<id>`, so `bench-42` matches 111,111 keys among ids 42 to 4,299,999 (none among the
newest 5.7 million) and `bench-1` 1.1 million among ids 1 to 1,999,999. A daemon runs on it in
this process (the open console), and each page is fetched over loopback 0.1 s apart.

Not a timed test: it prints figures (median, p95, max of the time to the last byte). The
target is 100 ms server time (p95) at 10 million jobs. It also walks every "search older" page
of `bench-42` from the newest job to its first match and reports how many pages that took.

    .venv/bin/python -m tests.bench.bench_prefix_search [--rows 10000000] [--renders 20]
        [--database NAME] [--only "old keys" ...] [--no-walk]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from urllib.parse import urlencode

import aiohttp
import asyncpg

from tests.bench.bench_console import (
    FIGURES,
    QUEUES,
    SERVER,
    ensure_database,
    series,
    timed,
)
from tests.bench.common import Figure, machine_info, print_table, save_results
from tests.harness import make_settings, running_daemon

SEARCHES = (
    ("key prefix, 11 keys", {"key_prefix": "bench-99999"}),
    ("key prefix, every key", {"key_prefix": "bench-"}),
    ("key prefix, 111,111 old keys", {"key_prefix": "bench-42"}),
    ("key prefix, 1.1 million old keys", {"key_prefix": "bench-1"}),
    ("key prefix + state", {"key_prefix": "bench-77", "state": "dead"}),
)
LIMIT = 25


async def next_cursor(client: aiohttp.ClientSession, api: str, query: dict[str, str]) -> str | None:
    async with client.get(f"{api}/v1/jobs", params={**query, "limit": str(LIMIT)}) as r:
        assert r.status == 200, (r.status, await r.text())
        page = await r.json()
    return page["next_cursor"]  # type: ignore[no-any-return]


async def walk_to_first_match(client: aiohttp.ClientSession, api: str, prefix: str) -> None:
    """Follow next_cursor from the newest job until a page holds a match: the pages (each
    one request) and the time that took, when the search is sliced."""
    cursor, pages, started = None, 0, time.perf_counter()
    while True:
        params = {"key_prefix": prefix, "limit": str(LIMIT)}
        if cursor is not None:
            params["cursor"] = cursor
        async with client.get(f"{api}/v1/jobs", params=params) as r:
            page = await r.json()
        pages += 1
        if page["items"] or page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    took = time.perf_counter() - started
    print(f"{prefix}: the first match on page {pages} ({took:.1f} s for all {pages} requests)")
    FIGURES.append(
        Figure(f"pages to the first {prefix} match", pages, "pages", note=f"{took:.1f} s in all")
    )


async def main(args: argparse.Namespace) -> None:
    if args.database:
        url = SERVER.rsplit("/", 1)[0] + f"/{args.database}"
    else:
        url = await ensure_database(args.rows, keep=True)
    settings = make_settings(url, queues={q: {} for q in QUEUES}, log_level="WARNING")
    async with running_daemon(settings) as daemon, aiohttp.ClientSession() as client:
        base = daemon.base_url + "/console"
        print(f"\n{args.rows:,} jobs; {args.renders} renders each, 0.1 s apart")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        await timed(client, f"{base}/jobs")  # the first render warms the daemon's pool
        for name, query in SEARCHES:
            if args.only and not any(word in name for word in args.only):
                continue
            await series(client, name, f"{base}/jobs?{urlencode(query)}", args.renders, 0.1)
            after = await next_cursor(client, daemon.base_url, query)
            if after is None:
                continue
            older = urlencode({**query, "limit": LIMIT, "cursor": after})
            await series(client, f"{name}, page 2", f"{base}/jobs?{older}", args.renders, 0.1)
        if not args.no_walk:
            await walk_to_first_match(client, daemon.base_url, "bench-42")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    conn = await asyncpg.connect(url)
    version = await conn.fetchval("SHOW server_version")
    await conn.close()
    print_table(f"key-prefix search at {args.rows:,} jobs (server time, loopback)", FIGURES)
    path = save_results("bench_prefix_search", machine_info(version, {}), FIGURES)
    print(f"results appended to {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--database", help="a filled database on the server (default: fill)")
    parser.add_argument(
        "--only", action="append", help="the searches whose name contains this (repeatable)"
    )
    parser.add_argument("--no-walk", action="store_true", help="skip the search-older walk")
    asyncio.run(main(parser.parse_args()))
