"""A fast loopback webhook receiver for the HTTP-effect benchmarks: answers 200 `{}` to anything.

Run in its own process (`python -m tests.bench.target_server PORT`) so the benchmark's event
loop and the daemon's are not the receiver's bottleneck.
"""

from __future__ import annotations

import sys

from aiohttp import web


async def receive(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=b"{}", content_type="application/json")


def main() -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", receive)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    web.run_app(
        app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None, backlog=1024
    )


if __name__ == "__main__":
    main()
