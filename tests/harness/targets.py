"""A loopback HTTP target that records every request, answers by a programmable rule, and
signals each change: `await target.wait_for(lambda t: t.inflight == 50)` wakes as requests
arrive and finish, with no timer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.harness.waits import free_port, wait_signalled


@dataclass
class Target:
    """Records every request; `respond` answers it (default: 200 `{"ok": true}`)."""

    respond: Callable[[web.Request, int], Awaitable[web.StreamResponse]] | None = None
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    url: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            body = await request.read()
            entry = {
                "key": request.headers.get("Idempotency-Key"),
                "at": time.monotonic(),
                "headers": dict(request.headers),
                "body": body,
                "path": request.path,
            }
            self.requests.append(entry)
            self.changed.set()
            count = sum(1 for r in self.requests if r["key"] == entry["key"])
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.respond is not None:
                return await self.respond(request, count)
            return web.json_response({"ok": True})
        finally:
            self.inflight -= 1
            self.changed.set()

    def request_keys(self) -> list[str]:
        return [r["key"] for r in self.requests]

    async def wait_for(
        self,
        predicate: Callable[[Target], bool],
        timeout_s: float = 20.0,
        what: str = "the target's requests",
    ) -> None:
        """Until `predicate(self)` holds, checked as each request arrives and ends."""
        await wait_signalled(self.changed, lambda: predicate(self), timeout_s, what)


@contextlib.asynccontextmanager
async def serve_target(target: Target, ssl_context: Any = None) -> AsyncIterator[Target]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", target._handle)
    # a short shutdown: requests a test left hanging must not hold up the cleanup
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    scheme = "https" if ssl_context else "http"
    target.url = f"{scheme}://127.0.0.1:{port}/hook"
    try:
        yield target
    finally:
        await runner.cleanup()


def starts_above_bucket(
    starts: list[float], burst: float, rate_per_s: float, jitter_s: float = 0.05
) -> float:
    """How far the sorted start times `starts` (seconds, as the target saw them) exceed a token
    bucket's promise at worst: over every window [a, b], count - (burst + rate x (b - a +
    jitter_s)). The bucket times a start when its token is taken, the target when the request
    is handled: on a loaded machine (an in-process daemon shares the target's event loop) a few
    requests wait and then arrive together, so the window is widened by `jitter_s`. The caller
    allows 1 more: the start that opens a window. A limiter that leaked would exceed it by the
    leak's rate: one that let 2 x the rate through is 50 over in a second at 50/s."""
    return max(
        (j - i + 1) - (burst + rate_per_s * (starts[j] - starts[i] + jitter_s))
        for i in range(len(starts))
        for j in range(i, len(starts))
    )
