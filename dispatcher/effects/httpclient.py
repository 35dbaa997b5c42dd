"""The HTTP/1.1 client of the `http` effect: keep-alive connections pooled per origin, one
write per request, the response read only as far as the effect needs it.

Why not aiohttp's client: on a loopback drain its per-request machinery (request and response
objects, header multidicts, payload registry, timer contexts, request info) cost about four
times a plain protocol doing the same exchange (py-spy and `process_time`, 2026-12-01: 540 µs
against 110-140 µs per request on the loaded 2-core machine), most of the daemon's CPU per HTTP
job. The effect needs a small subset of HTTP: send one request with a body it already encoded,
read the status, the headers that frame the body and the ones it classifies by (Retry-After,
Location), and the first `excerpt_bytes` of the body.

A request that finds every connection slot taken waits in a queue, not in its own task: the
callback that reads a response sends the next waiting request on that connection at once (no
pipelining: one request per connection at a time), so a waiting request costs no wake-up
before it is sent.

What stays exactly as strong as before:

- SSRF: the effect checks the URL (literal addresses included) before calling `request`; host
  names are resolved only through the `GuardedResolver` given here, which refuses any answer
  holding a disallowed address, and the connection goes to an address of that answer. Literal
  addresses are checked against the policy again here, without DNS.
- TLS: certificates and host names are verified by the `ssl.SSLContext` (the system's trust,
  plus `http.ca_file` when configured); plain http only where the policy allowed it.
- Timeouts: one deadline per request covers waiting for a connection, connecting, sending and
  reading the head. Past it, a request with no response head fails with `TimeoutError`; one
  whose head arrived is answered with the excerpt read so far (the status decided already).
- No redirects are followed, no cookies kept, no proxy used, no credentials sent but the
  target's own headers.
- Bounded reads (dispatcher.effects.http_response): a response head larger than
  `MAX_HEAD_BYTES` is a protocol error; a body is read at most `excerpt_bytes + 1` bytes past
  what framing needs. A connection is reused only
  when its response ended exactly where framing says (Content-Length or chunked, never both),
  so a response can never leak into the next request's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections import deque
from typing import NamedTuple

from aiohttp.abc import AbstractResolver

from dispatcher.effects.http_response import (
    MAX_CHUNK_LINE_BYTES,
    MAX_HEAD_BYTES,
    ConnectError,
    HttpClientError,
    ProtocolError,
    Response,
    ResponseReader,
    ServerDisconnected,
)
from dispatcher.effects.ssrf import TargetPolicy

__all__ = [
    "KEEPALIVE_S",
    "MAX_CHUNK_LINE_BYTES",
    "MAX_HEAD_BYTES",
    "ConnectError",
    "HttpClient",
    "HttpClientError",
    "Origin",
    "ProtocolError",
    "Response",
    "ServerDisconnected",
]

KEEPALIVE_S = 15.0  # an idle connection is closed after this long (aiohttp's default)


class Origin(NamedTuple):
    """Where a request goes: the pool key of its connections."""

    tls: bool
    host: str  # as in the URL (IDNA-encoded); an IPv6 literal without brackets
    port: int


class _Exchange(asyncio.Protocol):
    """One connection; at most one request on it at a time. Its `ResponseReader` parses the
    response as bytes arrive; `waiter` is resolved once the head and the excerpt are in (or the
    response ended).
    """

    def __init__(self, client: HttpClient, origin: Origin) -> None:
        self._client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.waiter: asyncio.Future[Response | None] | None = None
        self.request: _Request | None = None  # the request `waiter` answers
        self._reader = ResponseReader(0)

    def start(self, request: _Request) -> None:
        """Send `request` (whole: head and body, one write); its response resolves
        `request.response`."""
        assert self.transport is not None
        self._reader = ResponseReader(request.excerpt_bytes)
        self.waiter = request.response
        self.request = request
        request.exchange = self
        try:
            self.transport.write(request.data)
        except (OSError, RuntimeError) as exc:  # the transport closed under us
            self._fail(ServerDisconnected(f"the connection closed before the request: {exc}"))

    # asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: this connection cannot be trusted
            self.abort()
            return
        try:
            if self._reader.feed(data):
                self._answer()
        except HttpClientError as exc:
            self._fail_or_answer(exc)

    def eof_received(self) -> bool:
        self._fail_or_answer(ServerDisconnected("the target closed the connection"))
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._client._lost(self)
        what = f": {exc}" if exc else ""
        self._fail_or_answer(ServerDisconnected(f"the target closed the connection{what}"))

    def _fail_or_answer(self, exc: BaseException) -> None:
        """The exchange cannot go on (a fault, or its deadline). Once the head is in, the status
        has decided the outcome and the body read so far is the excerpt (it is only a
        diagnostic); before it, the request failed."""
        if self.waiter is None:
            return
        if self._reader.in_body:
            self._reader.reusable = False
            self._answer()
        else:
            self._fail(exc)

    # outcome --------------------------------------------------------------------------------
    def _answer(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():  # nobody waits for this response any more
            self.abort()
            return
        response = self._reader.response()
        request, self.request = self.request, None
        if self._reader.ended_cleanly() and not self.closed:
            self._client._reuse(self, request)  # may send the next waiting request on it
        else:
            self.abort()
        waiter.set_result(response)

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def expire(self, timeout_s: float) -> None:
        """The request's deadline passed: answer with what was read, or fail."""
        self._fail_or_answer(TimeoutError(f"no response within {timeout_s:g} s"))

    def abort(self) -> None:
        self.waiter = self.request = None
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
            self._client._lost(self)


class _Request:
    """One request: waiting for a slot (`queued`), connecting, or exchanging on `exchange`
    until `response` is set (to None when it was handed a slot but no connection: its caller
    connects). The deadline acts on the exchange only while it still serves this request: a
    connection answered and pooled may already serve the next one."""

    __slots__ = ("data", "excerpt_bytes", "exchange", "holds_slot", "origin", "queued", "response")

    def __init__(
        self, response: asyncio.Future[Response | None], origin: Origin, data: bytes, excerpt: int
    ) -> None:
        self.response = response
        self.origin = origin
        self.data = data
        self.excerpt_bytes = excerpt
        self.exchange: _Exchange | None = None
        self.holds_slot = False  # one of the client's `max_connections` slots is this request's
        self.queued = False  # in the client's queue of requests waiting for a slot

    def expire(self, timeout_s: float) -> None:
        exchange = self.exchange
        if exchange is not None:
            if exchange.waiter is self.response:
                exchange.expire(timeout_s)
        elif self.queued and not self.response.done():  # skipped when the queue reaches it
            self.response.set_exception(TimeoutError(f"no connection within {timeout_s:g} s"))


class _Deadlines:
    """Request deadlines of one timeout value, in the order they were set (so in deadline
    order) with one timer for the earliest: no timer handle per request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self._loop = loop
        self._timeout_s = timeout_s
        self._entries: dict[_Request, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, entry: _Request) -> float:
        """Start `entry`'s deadline; return it (loop time)."""
        when = self._loop.time() + self._timeout_s
        self._entries[entry] = when
        if self._timer is None:
            self._timer = self._loop.call_at(when, self._fire)
        return when

    def remove(self, entry: _Request) -> None:
        self._entries.pop(entry, None)

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        entries = self._entries
        while entries:
            exchange, when = next(iter(entries.items()))
            if when > now:
                self._timer = self._loop.call_at(when, self._fire)
                return
            del entries[exchange]
            exchange.expire(self._timeout_s)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class HttpClient:
    """Keep-alive connections pooled per origin, at most `max_connections` in use (connecting
    or exchanging) at once; further requests wait, first come first served, within their own
    deadline. Idle connections are closed after `KEEPALIVE_S`."""

    def __init__(
        self,
        resolver: AbstractResolver,
        policy: TargetPolicy,
        ssl_context: ssl.SSLContext,
        max_connections: int,
    ) -> None:
        self._resolver = resolver
        self._policy = policy
        self._ssl = ssl_context
        self._limit = max_connections
        self._loop = asyncio.get_running_loop()
        self._idle: dict[Origin, list[_Exchange]] = {}
        self._in_use = 0  # slots taken: connections connecting or in an exchange
        self._waiting: deque[_Request] = deque()  # first come, first served
        self._deadlines: dict[float, _Deadlines] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    async def request(
        self, origin: Origin, data: bytes, timeout_s: float, excerpt_bytes: int
    ) -> Response:
        """Send `data` (a whole request: head and body) and read the response within
        `timeout_s`, from the call to the response head (TimeoutError past it)."""
        if self._closed:
            raise RuntimeError("the HTTP client is closed")
        deadlines = self._deadlines.get(timeout_s)
        if deadlines is None:
            deadlines = self._deadlines[timeout_s] = _Deadlines(self._loop, timeout_s)
        request = _Request(self._loop.create_future(), origin, data, excerpt_bytes)
        when = deadlines.add(request)  # a dict entry: no timer of its own
        try:
            if self._in_use < self._limit and not self._waiting:
                self._in_use += 1
                request.holds_slot = True
                exchange = self._pop_idle(origin)
                if exchange is None:
                    await self._connect_and_start(request, when, timeout_s)
                else:
                    exchange.start(request)
            else:  # `_release_slot` sends it when a slot frees (no wake-up of this task)
                request.queued = True
                self._waiting.append(request)
            response = await request.response
            if response is None:  # handed a slot but no pooled connection to its origin
                request.response = self._loop.create_future()
                await self._connect_and_start(request, when, timeout_s)
                response = await request.response
            assert response is not None
            return response
        finally:
            deadlines.remove(request)
            exchange = request.exchange
            if exchange is not None and exchange.waiter is request.response:
                exchange.abort()  # not answered (cancelled): never reuse it
            if request.holds_slot:
                request.holds_slot = False
                self._release_slot()

    def _pop_idle(self, origin: Origin) -> _Exchange | None:
        """The most recently used pooled connection to `origin` that is still open."""
        idle = self._idle.get(origin)
        now = self._loop.time()
        while idle:
            exchange = idle.pop()
            if not exchange.closed and now - exchange.idle_since < KEEPALIVE_S:
                return exchange
            exchange.abort()
        return None

    async def _connect_and_start(self, request: _Request, when: float, timeout_s: float) -> None:
        """Connect (within the request's deadline, `when`) and send `request` on the new
        connection; the request holds a slot."""
        try:
            async with asyncio.timeout_at(when):
                exchange = await self._connect(request.origin)
        except TimeoutError:
            raise TimeoutError(f"no connection within {timeout_s:g} s") from None
        exchange.start(request)

    def _release_slot(self) -> None:
        """Hand the slot to the first waiting request, and send it at once on a pooled
        connection to its origin (the one just answered, when the origins match); without one
        the request is woken to connect. With nobody waiting, free the slot.

        Sending from here, in the callback that read the previous response, saves each waiting
        request a wake-up of its task before it is sent (one event-loop step per request: the
        drain keeps `max_in_flight` requests queued on `max_connections` connections)."""
        while self._waiting:
            request = self._waiting.popleft()
            request.queued = False
            if request.response.done():  # its deadline passed, or its caller was cancelled
                continue
            request.holds_slot = True
            exchange = self._pop_idle(request.origin)
            if exchange is None:
                request.response.set_result(None)
            else:
                exchange.start(request)
            return
        self._in_use -= 1

    async def _connect(self, origin: Origin) -> _Exchange:
        last: OSError | None = None
        for family, host, port in await self._addresses(origin):
            try:
                _, exchange = await self._loop.create_connection(
                    lambda: _Exchange(self, origin),
                    host,
                    port,
                    family=family,
                    ssl=self._ssl if origin.tls else None,
                    server_hostname=origin.host if origin.tls else None,
                )
            except ssl.SSLError as exc:  # certificate or handshake: no other address helps
                raise ConnectError(f"TLS with {origin.host}:{origin.port} failed: {exc}") from exc
            except OSError as exc:
                last = exc
                continue
            return exchange
        raise ConnectError(f"cannot connect to {origin.host}:{origin.port}: {last}") from last

    async def _addresses(self, origin: Origin) -> list[tuple[int, str, int]]:
        """The addresses to try, each allowed by the policy (a refusal raises TargetRefused)."""
        try:
            literal = ipaddress.ip_address(origin.host)
        except ValueError:
            literal = None
        if literal is not None:  # judged by check_url already; again here, without DNS
            self._policy.check_address(str(literal), host=origin.host)
            family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
            return [(family, str(literal), origin.port)]
        try:
            results = await self._resolver.resolve(origin.host, origin.port, socket.AF_UNSPEC)
        except OSError as exc:
            raise ConnectError(f"cannot resolve {origin.host}: {exc}") from exc
        return [(r["family"], r["host"], r["port"]) for r in results]

    def _reuse(self, exchange: _Exchange, answered: _Request | None) -> None:
        """A response ended cleanly: the connection waits for the next request, which may be
        waiting already."""
        if self._closed:
            exchange.abort()
            return
        exchange.idle_since = self._loop.time()
        self._idle.setdefault(exchange.origin, []).append(exchange)
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(KEEPALIVE_S, self._sweep)
        if answered is not None and answered.holds_slot and self._waiting:
            answered.holds_slot = False  # its slot goes to the first waiting request
            self._release_slot()

    def _lost(self, exchange: _Exchange) -> None:
        idle = self._idle.get(exchange.origin)
        if idle and exchange in idle:
            idle.remove(exchange)

    def _sweep(self) -> None:
        """Close connections idle for `KEEPALIVE_S`; runs only while some are idle."""
        self._sweeper = None
        now = self._loop.time()
        for origin, idle in list(self._idle.items()):
            for exchange in [e for e in idle if now - e.idle_since >= KEEPALIVE_S]:
                exchange.abort()
            if not idle:
                del self._idle[origin]
        if self._idle:
            self._sweeper = self._loop.call_later(KEEPALIVE_S / 2, self._sweep)

    async def close(self) -> None:
        """Close every connection; requests in flight fail. Idempotent."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for deadlines in self._deadlines.values():
            deadlines.close()
        for idle in list(self._idle.values()):
            for exchange in list(idle):
                exchange.abort()
        self._idle.clear()
        for request in self._waiting:
            if not request.response.done():
                request.response.cancel()
