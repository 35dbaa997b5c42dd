"""A client that trickles its body is cut off with 408 (aiohttp has no read timeout of its own)."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.harness.fixtures import Spawn


async def test_trickled_body_gets_408_and_the_daemon_keeps_serving(
    db_url: str, spawn: Spawn
) -> None:
    daemon = await spawn({"DISPATCHER_DATABASE_URL": db_url, "DISPATCHER_BODY_READ_TIMEOUT_S": "1"})
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    writer.write(
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    await writer.drain()
    started = time.monotonic()
    status_line = await asyncio.wait_for(reader.readline(), 10)
    elapsed = time.monotonic() - started
    writer.close()
    assert status_line.startswith(b"HTTP/1.1 408"), status_line
    assert 0.9 <= elapsed < 5, elapsed
    async with aiohttp.ClientSession() as s, s.get(f"{daemon.base_url}/healthz") as r:
        assert r.status == 200
    assert await daemon.stop() == 0
