"""The soak's loopback HTTP target: one server, many behaviours, every request recorded.

A job's URL names its queue and behaviour: `/q/<queue>/<behaviour>/<key>`. Behaviours that
misbehave only on early attempts (`flaky`, `limited`, `reset`, `endless`) let the job succeed
later, so the soak ends with known outcomes; `fail` always answers 500 (the job goes dead).

Each request is a `Hit`: who sent it (the daemon's User-Agent, `chaos-d<n>`), its
Idempotency-Key and webhook-id, when it opened, when the target had decided its status (the
response head was sent) and when it closed. The server cancels a handler whose client went away
(`handler_cancellation`), so a killed daemon's or a timed-out attempt's request closes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from tests.harness import free_port

BEHAVIOURS = (
    "ok", "slow", "flaky", "fail", "limited", "nul", "gzip", "huge", "reset", "endless",
)  # fmt: skip
RETRY_AFTER_S = 1
HUGE_BYTES = 8 * 1024 * 1024
BOMB_INFLATED_BYTES = 256 * 1024 * 1024  # ~250 KB on the wire
ENDLESS_CAP_S = 60.0  # a never-ending body ends when its reader goes, or after this


@dataclass
class Hit:
    key: str  # the job's key, from the URL
    idempotency_key: str
    webhook_id: str
    sender: str  # the daemon's User-Agent
    queue: str
    behaviour: str
    opened: float
    answered: float | None = None  # when the response head went out (its status decided)
    closed: float | None = None
    status: int | None = None
    retry_after_s: float | None = None


@dataclass
class ChaosTarget:
    hits: list[Hit] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    url: str = ""
    _bomb: bytes = b""

    def job_url(self, queue: str, behaviour: str, key: str) -> str:
        return f"{self.url}/q/{queue}/{behaviour}/{key}"

    def bomb(self) -> bytes:
        if not self._bomb:
            squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
            chunk = bytes(1024 * 1024)
            parts = [squeeze.compress(chunk) for _ in range(BOMB_INFLATED_BYTES // len(chunk))]
            self._bomb = b"".join(parts) + squeeze.flush()
        return self._bomb

    async def handle(self, request: web.Request) -> web.StreamResponse:
        _, queue, behaviour, key = [*request.path.split("/", 4), "", "", ""][1:5]
        hit = Hit(
            key=key,
            idempotency_key=request.headers.get("Idempotency-Key", ""),
            webhook_id=request.headers.get("webhook-id", ""),
            sender=request.headers.get("User-Agent", ""),
            queue=queue,
            behaviour=behaviour,
            opened=time.monotonic(),
        )
        self.hits.append(hit)
        attempt = self.seen[hit.key] = self.seen.get(hit.key, 0) + 1
        try:
            await request.read()
            return await self._answer(request, hit, attempt)
        finally:
            hit.closed = time.monotonic()

    async def _answer(self, request: web.Request, hit: Hit, attempt: int) -> web.StreamResponse:
        behaviour = hit.behaviour
        if behaviour == "slow":
            await asyncio.sleep(0.3 + (zlib.crc32(hit.key.encode()) % 12) / 10)
        if (behaviour == "flaky" and attempt <= 2) or behaviour == "fail":
            return await _send(request, hit, web.Response(status=500, text="chaos: failing"))
        if behaviour == "limited" and attempt == 1:
            hit.retry_after_s = RETRY_AFTER_S
            limited = web.Response(status=429, headers={"Retry-After": str(RETRY_AFTER_S)})
            return await _send(request, hit, limited)
        if behaviour == "reset" and attempt == 1:
            assert request.transport is not None
            request.transport.abort()
            return web.Response(status=200)  # never written: the connection is gone
        if behaviour == "endless" and attempt == 1:
            return await self._endless(request, hit)
        return await _send(request, hit, self._success(behaviour))

    def _success(self, behaviour: str) -> web.Response:
        if behaviour == "nul":
            return web.Response(status=200, body=b"a\x00b", content_type="text/plain")
        if behaviour == "gzip":
            headers = {"Content-Encoding": "gzip"}
            return web.Response(status=200, body=self.bomb(), headers=headers)
        if behaviour == "huge":
            return web.Response(status=200, body=b"x" * HUGE_BYTES)
        return web.json_response({"ok": True})

    async def _endless(self, request: web.Request, hit: Hit) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        hit.status, hit.answered = 200, time.monotonic()
        chunk = b"chaos " * 10_000
        deadline = time.monotonic() + ENDLESS_CAP_S
        with contextlib.suppress(ConnectionError, RuntimeError):
            while time.monotonic() < deadline:
                await response.write(chunk)
                await asyncio.sleep(0.01)
        return response


async def _send(request: web.Request, hit: Hit, response: web.Response) -> web.Response:
    hit.status, hit.answered = response.status, time.monotonic()
    return response


@contextlib.asynccontextmanager
async def serve(target: ChaosTarget) -> AsyncIterator[ChaosTarget]:
    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", target.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    target.url = f"http://127.0.0.1:{port}"
    await asyncio.to_thread(target.bomb)  # once, before the clock starts
    try:
        yield target
    finally:
        await runner.cleanup()
