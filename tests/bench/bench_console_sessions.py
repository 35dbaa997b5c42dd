"""What server-side console sessions and the guessing limit cost (issue 20). Prints figures.

- the session lookup alone (`session_is_active`, one index probe) with N live sessions;
- `/console/live.json` over loopback, signed in with a token (its session is looked up on
  every request) against the open console (anonymous sessions: no lookup), same daemon setup;
- the per-address table of failed authentications: time per failure and per check, and the
  memory of a full table (10,000 addresses).

    .venv/bin/python -m tests.bench.bench_console_sessions [--sessions 100000] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import time
import tracemalloc

import aiohttp
import asyncpg

from dispatcher.api.guessing import MAX_ADDRESSES, GuessLimiter
from dispatcher.db import schema
from dispatcher.db.pool import create_pool
from dispatcher.db.sessions import SessionRepository
from tests.console.common import OPERATOR_TOKEN, TOKENS, sign_in
from tests.harness import make_settings, running_daemon

SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


async def scratch_database() -> str:
    name = f"bench_console_sessions_{os.getpid()}"
    admin = await asyncpg.connect(SERVER)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = SERVER.rsplit("/", 1)[0] + f"/{name}"
    conn = await asyncpg.connect(dsn)
    try:
        await schema.migrate(conn)
    finally:
        await conn.close()
    return dsn


async def drop(dsn: str) -> None:
    admin = await asyncpg.connect(SERVER)
    try:
        await admin.execute(f'DROP DATABASE "{dsn.rsplit("/", 1)[1]}" WITH (FORCE)')
    finally:
        await admin.close()


def summary(samples_ms: list[float]) -> str:
    samples_ms.sort()
    p99 = samples_ms[int(len(samples_ms) * 0.99) - 1]
    return f"p50 {statistics.median(samples_ms):.3f} ms, p99 {p99:.3f} ms (n={len(samples_ms)})"


async def lookup(dsn: str, sessions: int, requests: int) -> None:
    pool = await create_pool(dsn, size=2, application_name="bench")
    try:
        await pool.execute(
            "INSERT INTO dispatcher.console_sessions (id_hash, token_id, token_name, client, "
            "expires_at) SELECT sha256(g::text::bytea), 't', 'ops', '192.0.2.1', "
            "now() + interval '1 hour' FROM generate_series(1, $1::int) g",
            sessions,
        )
        await pool.execute("ANALYZE dispatcher.console_sessions")
        repo, samples = SessionRepository(pool), []
        for n in range(requests):
            key = hashlib.sha256(str(1 + n % sessions).encode()).digest()
            started = time.perf_counter()
            assert await repo.is_active(key, "t")
            samples.append((time.perf_counter() - started) * 1000)
        print(f"session lookup, {sessions:,} live sessions: {summary(samples)}")
        await pool.execute("TRUNCATE dispatcher.console_sessions")
    finally:
        await pool.close()


async def live_json(dsn: str, requests: int, *, signed_in: bool) -> None:
    settings = make_settings(dsn, api_tokens=TOKENS if signed_in else [])
    jar = aiohttp.CookieJar(unsafe=True)
    async with running_daemon(settings) as daemon, aiohttp.ClientSession(cookie_jar=jar) as client:
        if signed_in:
            await sign_in(client, daemon.base_url, OPERATOR_TOKEN)
        url, samples = daemon.base_url + "/console/live.json", []
        for _ in range(requests):
            started = time.perf_counter()
            async with client.get(url) as r:
                assert r.status == 200
                await r.read()
            samples.append((time.perf_counter() - started) * 1000)
    label = "signed in (session looked up)" if signed_in else "open console (no lookup)"
    print(f"GET /console/live.json, {label}: {summary(samples)}")


def limiter() -> None:
    table = GuessLimiter(10, 60)
    addresses = [f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}" for n in range(MAX_ADDRESSES)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    for address in addresses:
        table.failed(address, "bearer token")
    per_failure_us = (time.perf_counter() - started) / len(addresses) * 1e6
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    started = time.perf_counter()
    for address in addresses:
        table.retry_after_s(address)
    per_check_us = (time.perf_counter() - started) / len(addresses) * 1e6
    print(
        f"failed-authentication table: {per_failure_us:.1f} µs per failure, "
        f"{per_check_us:.1f} µs per check, {held / 1e6:.2f} MB for {len(table):,} addresses"
    )


async def main(args: argparse.Namespace) -> None:
    logging_quiet()
    dsn = await scratch_database()
    try:
        await lookup(dsn, args.sessions, args.requests)
        for signed_in in (False, True, False, True):  # alternated: the machine is shared
            await live_json(dsn, args.requests, signed_in=signed_in)
    finally:
        await drop(dsn)
    limiter()


def logging_quiet() -> None:
    import logging

    logging.getLogger("dispatcher.api.guessing").setLevel(logging.ERROR)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=2_000)
    asyncio.run(main(parser.parse_args()))
