"""A loopback TCP proxy in front of the test PostgreSQL that a test can cut and restore: a
database outage on demand, without stopping the server other tests share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests.harness import free_port


class OutageProxy:
    """`cut()` drops every proxied connection and closes the port (new connections are
    refused); `restore()` listens on the same port again."""

    def __init__(self, upstream_url: str):
        parts = urlsplit(upstream_url)
        query = dict(parse_qsl(parts.query))
        socket_dir = query.pop("host", "")
        # the embedded server listens on a Unix socket only (its URL names the directory)
        self._socket = f"{socket_dir}/.s.PGSQL.{parts.port or 5432}" if socket_dir else ""
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._parts = parts._replace(query=urlencode(query))
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """The upstream URL with the proxy's address in place of the server's."""
        netloc = self._parts.netloc.rsplit("@", 1)
        address = f"127.0.0.1:{self.port}"
        at = netloc[0] + "@" + address if len(netloc) == 2 else address
        return urlunsplit(self._parts._replace(netloc=at))

    @property
    def is_cut(self) -> bool:
        return self._server is None

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            if self._socket:
                server_r, server_w = await asyncio.open_unix_connection(self._socket)
            else:
                server_r, server_w = await asyncio.open_connection(*self._upstream)
        except OSError:
            client_w.transport.abort()
            return
        self._open |= {client_w, server_w}
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))
        self._open -= {client_w, server_w}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()


@contextlib.asynccontextmanager
async def outage_proxy(upstream_url: str) -> AsyncIterator[OutageProxy]:
    proxy = OutageProxy(upstream_url)
    await proxy.restore()
    try:
        yield proxy
    finally:
        await proxy.cut()
