"""Soak: a steady rate of HTTP jobs against a target that fails at random, for a bounded time.

Checks that the daemon's memory stays flat and that no job is lost: every job sent reaches a
terminal state (succeeded, or dead after its attempts) and the target saw each succeeded key.
Not part of CI; documented in the README.

    .venv/bin/python -m tests.bench.soak [--seconds 600] [--rate 200]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import asyncpg
import psutil
from aiohttp import web

from tests.bench.common import Bench, Figure, daemon, run, wait_for
from tests.harness import free_port

SOAK_ENV = {
    "DISPATCHER_TARGET_ALLOW_HTTP": "true",
    "DISPATCHER_TARGET_ALLOW_CIDRS": "127.0.0.0/8",
    "DISPATCHER_QUEUES__DEFAULT__BACKOFF_BASE_S": "0.2",
    "DISPATCHER_QUEUES__DEFAULT__BACKOFF_CAP_S": "5",
    "DISPATCHER_QUEUES__DEFAULT__MAX_ATTEMPTS": "6",
    "DISPATCHER_LOG_LEVEL": "WARNING",
}


class FlakyTarget:
    """Answers 200, or at random 500 (10 %), 429 with Retry-After 1 (5 %), or a slow 200."""

    def __init__(self) -> None:
        self.succeeded: set[str] = set()
        self.requests = 0
        self._rng = random.Random(7)

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        roll = self._rng.random()
        if roll < 0.10:
            return web.Response(status=500)
        if roll < 0.15:
            return web.Response(status=429, headers={"Retry-After": "1"})
        if roll < 0.20:
            await asyncio.sleep(0.2)
        self.succeeded.add(request.headers["Idempotency-Key"])
        return web.json_response({"ok": True})


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("soak").open()
    target = FlakyTarget()
    app = web.Application()
    app.router.add_post("/hook", target.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/hook"
    samples: list[tuple[float, float]] = []
    sent = 0
    async with bench.server.database() as dsn, daemon(dsn, SOAK_ENV) as d:
        assert d.proc is not None
        process = psutil.Process(d.proc.pid)
        pool = await asyncpg.create_pool(dsn, min_size=4, max_size=4)
        assert pool is not None
        conn = await asyncpg.connect(dsn)
        try:
            started = time.monotonic()
            next_sample = started
            while time.monotonic() - started < args.seconds:
                now = time.monotonic()
                if now >= next_sample:
                    samples.append((now - started, process.memory_info().rss / 2**20))
                    next_sample += 5
                due = started + sent / args.rate
                if due > now:
                    await asyncio.sleep(due - now)
                await pool.execute(
                    "SELECT dispatcher.enqueue($1, 'http', target => jsonb_build_object('url', "
                    "$2::text))",
                    f"soak-{sent}",
                    url,
                )
                sent += 1
            await wait_for(lambda: _all_terminal(conn), 120, what="every soak job terminal")
            counts = dict(
                await conn.fetch("SELECT state, count(*) FROM dispatcher.jobs GROUP BY state")
            )
            succeeded_keys = {
                r["key"]
                for r in await conn.fetch(
                    "SELECT key FROM dispatcher.jobs WHERE state = 'succeeded'"
                )
            }
        finally:
            await conn.close()
            await pool.close()
    await runner.cleanup()
    quarter = max(1, len(samples) // 4)
    first = sum(m for _, m in samples[:quarter]) / quarter
    last = sum(m for _, m in samples[-quarter:]) / quarter
    lost = sent - sum(counts.values())
    bench.details.update(
        {
            "sent": sent,
            "states": counts,
            "rss_samples_mb": samples,
            "target_requests": target.requests,
        }
    )
    bench.add(Figure("jobs sent", sent, "jobs", note=f"{args.seconds:.0f} s at {args.rate}/s"))
    bench.add(
        Figure(
            "jobs lost (sent - stored terminal)", lost, "jobs", at_most=0, note=f"states {counts}"
        )
    )
    bench.add(
        Figure(
            "succeeded jobs the target never saw",
            len(succeeded_keys - target.succeeded),
            "jobs",
            at_most=0,
        )
    )
    bench.add(
        Figure(
            "daemon RSS, last quarter / first quarter",
            last / first,
            "ratio",
            at_most=1.2,
            note=f"{first:.0f} MB -> {last:.0f} MB",
        )
    )
    bench.finish("soak")


async def _all_terminal(conn: asyncpg.Connection) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT NOT EXISTS (SELECT 1 FROM dispatcher.jobs "
            "WHERE state NOT IN ('succeeded', 'dead', 'cancelled'))"
        )
    )


def _args() -> Any:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=float, default=200)
    return parser.parse_args()


if __name__ == "__main__":
    run(lambda: main(_args()))
