"""A loopback TCP proxy in front of PostgreSQL that a test can stall: while stalled it forwards
no byte in either direction, yet keeps every socket open, as a network partition would look to
both ends (no reset, no FIN; the client's statements simply never answer)."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

CHUNK = 64 * 1024


class StallableProxy:
    """Forwards 127.0.0.1:`port` to the server of `upstream_url` (TCP, or the Unix socket named
    by a `host=/dir` parameter). `stall()` stops forwarding at once, `resume()` lets it flow."""

    def __init__(self, upstream_url: str):
        parts = urlsplit(upstream_url)
        params = dict(parse_qsl(parts.query))
        self._upstream_port = parts.port or 5432
        socket_dir = params.get("host", "")
        self._unix_path = (
            f"{socket_dir}/.s.PGSQL.{self._upstream_port}" if socket_dir.startswith("/") else ""
        )
        self._upstream_host = parts.hostname or "127.0.0.1"
        self._upstream_url = upstream_url
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.connections = 0

    async def start(self) -> StallableProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        """`upstream_url` with the proxy as its server (extra `params` become query parameters,
        which asyncpg passes on as server settings)."""
        return self.url_with()

    def url_with(self, **params: str) -> str:
        parts = urlsplit(self._upstream_url)
        query = {k: v for k, v in parse_qsl(parts.query) if k not in ("host", "port")}
        query.update(params)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def close(self) -> None:
        self._flowing.set()
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(client_w)
        try:
            if self._unix_path:
                server_r, server_w = await asyncio.open_unix_connection(self._unix_path)
            else:
                server_r, server_w = await asyncio.open_connection(
                    self._upstream_host, self._upstream_port
                )
        except OSError:
            client_w.close()
            self._writers.discard(client_w)
            return
        self._writers.add(server_w)
        pumps = [
            asyncio.create_task(self._pump(client_r, server_w)),
            asyncio.create_task(self._pump(server_r, client_w)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._tasks.difference_update(pumps)
            for writer in (client_w, server_w):
                writer.close()
                self._writers.discard(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy until end of stream; each chunk waits for the flow both before it is read and
        before it is written, so a stall holds back even the bytes already in flight."""
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # one side gone: close the other too (as a dropped connection would)
            with contextlib.suppress(Exception):
                writer.close()
