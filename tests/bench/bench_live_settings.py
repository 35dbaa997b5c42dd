"""How fast a run-time change reaches every daemon: three daemons on one database; a queue's run
window is switched closed and open again through one daemon's `PATCH /v1/queues/{name}`, and
each daemon's `dispatcher_queue_window_open` gauge is polled until it shows the change. The
figure is the time from the PATCH's answer to the last daemon showing it (NOTIFY 'limits', the
daemon's read of the settings, its gauge), against the promise of one second.

    .venv/bin/python -m tests.bench.bench_live_settings [--changes 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg

from tests.bench.common import Bench, Figure, daemon, percentile, run, run_migrate

GAUGE = 'dispatcher_queue_window_open{queue="default"}'


async def gauge(session: aiohttp.ClientSession, base_url: str) -> str | None:
    async with session.get(f"{base_url}/metrics") as r:
        text = await r.text()
    return next((ln.split()[-1] for ln in text.splitlines() if ln.startswith(GAUGE)), None)


async def shown_everywhere(
    session: aiohttp.ClientSession, urls: list[str], value: str, deadline_s: float = 10.0
) -> float:
    """Seconds until every daemon's gauge reads `value` (polled every 5 ms)."""
    start = time.perf_counter()
    waiting = set(urls)
    while waiting:
        for url in list(waiting):
            if await gauge(session, url) == value:
                waiting.discard(url)
        if time.perf_counter() - start > deadline_s:
            raise TimeoutError(f"{len(waiting)} daemons never showed {value}")
        await asyncio.sleep(0.005)
    return time.perf_counter() - start


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("live_settings").open()
    name = f"bench_live_settings_{id(bench) % 100000}"
    admin = await asyncpg.connect(bench.server.url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = bench.server.database_url(name)
    try:
        run_migrate(dsn)
        async with contextlib.AsyncExitStack() as stack:
            urls = [(await stack.enter_async_context(daemon(dsn, {}))).base_url for _ in range(3)]
            samples: list[float] = []
            async with aiohttp.ClientSession() as session:
                for i in range(args.changes):
                    # a window that is closed now (a minute a day, twelve hours away), then none
                    later = datetime.now(UTC) + timedelta(hours=12)
                    closed = [f"daily {later:%H:%M}-{later + timedelta(minutes=1):%H:%M} UTC"]
                    body = {"windows": closed if i % 2 == 0 else None}
                    async with session.patch(f"{urls[0]}/v1/queues/default", json=body) as r:
                        assert r.status == 200, await r.text()
                    samples.append(
                        await shown_everywhere(session, urls, "0.0" if i % 2 == 0 else "1.0")
                    )
        bench.details["samples_s"] = samples
        bench.add(
            Figure("change to shown by all 3 daemons, p50", percentile(samples, 0.5) * 1000, "ms")
        )
        bench.add(
            Figure("change to shown by all 3 daemons, max", max(samples) * 1000, "ms", at_most=1000)
        )
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()
    bench.finish("Run-time settings: a change reaching every daemon (shared machine)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=20)
    run(lambda: main(parser.parse_args()))
