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
- Bounded reads: a response head larger than `MAX_HEAD_BYTES` is a protocol error; a body is
  read at most `excerpt_bytes + 1` bytes past what framing needs. A connection is reused only
  when its response ended exactly where framing says (Content-Length or chunked, never both),
  so a response can never leak into the next request's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
import zlib
from collections import deque
from typing import Any, NamedTuple

from aiohttp.abc import AbstractResolver
from multidict import CIMultiDict, CIMultiDictProxy

from dispatcher.effects.ssrf import TargetPolicy

MAX_HEAD_BYTES = 65_536
MAX_CHUNK_LINE_BYTES = 1024
KEEPALIVE_S = 15.0  # an idle connection is closed after this long (aiohttp's default)


class HttpClientError(Exception):
    """The exchange failed at the HTTP level (connection, framing); a transient failure."""


class ConnectError(HttpClientError):
    """No connection could be made to any address of the target."""


class ServerDisconnected(HttpClientError):
    """The target closed the connection before its response was complete."""


class ProtocolError(HttpClientError):
    """The target's response is not HTTP/1.x as this client reads it."""


class Origin(NamedTuple):
    """Where a request goes: the pool key of its connections."""

    tls: bool
    host: str  # as in the URL (IDNA-encoded); an IPv6 literal without brackets
    port: int


class Response(NamedTuple):
    status: int
    headers: CIMultiDictProxy[str]
    excerpt: bytes  # at most excerpt_bytes + 1 bytes of the (decoded) body


_EMPTY_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
# Header lines as RFC 9110 has them: a token, a colon at once (no space before it), a value
# without CR or LF. Each line starts with the CRLF that ended the one before.
_FIELD_LINES = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n]*)*")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")  # up to 2**64 - 1 bytes per chunk
_FRAMING_FIELDS = re.compile(
    rb"\r\n(content-length|transfer-encoding|connection|content-encoding):([^\r\n]*)",
    re.IGNORECASE,
)
_NO_BODY_STATUSES = frozenset({204, 304})


class _Exchange(asyncio.Protocol):
    """One connection; at most one request on it at a time. Parses the response as bytes
    arrive and resolves `waiter` once the head and the excerpt are in (or the response ended).
    """

    def __init__(self, client: HttpClient, origin: Origin) -> None:
        self._client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.waiter: asyncio.Future[Response | None] | None = None
        self.request: _Request | None = None  # the request `waiter` answers
        self._buffer = bytearray()
        self._excerpt_limit = 0
        self._reset()

    # per response --------------------------------------------------------------------------
    def _reset(self) -> None:
        self._status = 0
        self._fields = b""  # the header lines of the head, each after its CRLF
        self._in_body = False
        self._reusable = True
        self._length: int | None = None  # bytes of body still expected (Content-Length)
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still expected, then its CRLF
        self._chunk_state = "size"  # size, data, data_crlf, trailers
        self._until_close = False
        self._body = bytearray()
        self._inflate: Any = None

    def start(self, request: _Request) -> None:
        """Send `request` (whole: head and body, one write); its response resolves
        `request.response`."""
        assert self.transport is not None
        self._reset()
        self._excerpt_limit = request.excerpt_bytes
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
        self._buffer += data
        try:
            self._parse()
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
        if self._in_body:
            self._reusable = False
            self._answer()
        else:
            self._fail(exc)

    # parsing --------------------------------------------------------------------------------
    def _parse(self) -> None:
        while not self._in_body:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
                return
            if end > MAX_HEAD_BYTES:
                raise ProtocolError(f"response head larger than {MAX_HEAD_BYTES} bytes")
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            if not self._head(head):
                continue  # an informational (1xx) response: the real one follows
        self._read_body()

    def _head(self, head: bytes) -> bool:
        """Read a response head; False for a 1xx response (skipped). The header lines are
        checked and the framing headers found by two regular expressions over the whole
        block (a loop over the lines in Python cost 5 % of the daemon's CPU per HTTP job)."""
        end = head.find(b"\r\n")
        status_line, fields = (head, b"") if end < 0 else (head[:end], head[end:])
        if (
            len(status_line) < 12
            or not status_line.startswith(b"HTTP/1.")
            or status_line[8:9] != b" "
            or not status_line[9:12].isdigit()
            or (len(status_line) > 12 and status_line[12:13] != b" ")
        ):
            raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(status_line[9:12])
        if status < 100:
            raise ProtocolError(f"status {status} is not an HTTP status")
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("the target switched protocols (101), which was not asked")
            return False
        if not _FIELD_LINES.fullmatch(fields):
            bad = next(
                (
                    line
                    for line in fields.split(b"\r\n")[1:]
                    if not _FIELD_LINES.fullmatch(b"\r\n" + line)
                ),
                fields,
            )
            raise ProtocolError(f"malformed header line: {bad[:80]!r}")
        self._status = status
        self._fields = fields
        lengths: list[bytes] = []
        codings: list[bytes] = []
        close = status_line[7:8] != b"1"  # HTTP/1.0: the connection ends with the response
        content_coding = b""
        for name, value in _FRAMING_FIELDS.findall(fields):
            lowered = name.lower()
            if lowered == b"content-length":
                lengths.extend(v.strip() for v in value.split(b","))
            elif lowered == b"transfer-encoding":
                codings.extend(v.strip().lower() for v in value.split(b",") if v.strip())
            elif lowered == b"connection":
                close = close or b"close" in value.lower()
            else:
                content_coding = value.strip().lower()
        self._reusable = not close
        if content_coding in (b"gzip", b"x-gzip", b"deflate"):
            self._inflate = zlib.decompressobj(47)  # gzip or zlib, told by the header
        if status in _NO_BODY_STATUSES:
            self._length = 0
        elif codings:
            if codings[-1] == b"chunked":
                self._chunked = True
            else:
                self._until_close = True
                self._reusable = False
            if lengths:  # both framings: a smuggling attempt or a broken proxy; never reuse
                self._reusable = False
        elif lengths:
            if len(set(lengths)) != 1 or not lengths[0].isdigit():
                raise ProtocolError(f"invalid Content-Length {b', '.join(lengths)[:80]!r}")
            self._length = int(lengths[0])
        else:
            self._until_close = True
            self._reusable = False
        self._in_body = True  # the head is valid: from here on the status decides
        return True

    def _read_body(self) -> None:
        if self._chunked:
            self._read_chunked()
        elif self._length is not None:
            take = min(self._length, len(self._buffer))
            if take:
                self._keep(self._buffer[:take])
                del self._buffer[:take]
                self._length -= take
            if self._length == 0:
                self._answer()
                return
        else:  # until close
            if self._buffer:
                self._keep(self._buffer)
                self._buffer.clear()
        if self.waiter is not None and len(self._body) > self._excerpt_limit:
            self._reusable = False  # the rest of the body is not read: the connection ends
            self._answer()

    def _read_chunked(self) -> None:
        buffer = self._buffer
        while True:
            if self._chunk_state == "size":
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_CHUNK_LINE_BYTES:
                        raise ProtocolError("chunk size line too long")
                    return
                size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
                del buffer[: end + 2]
                if not _HEX.fullmatch(size_text):  # int() would also take 0x, _ and signs
                    raise ProtocolError(f"invalid chunk size {size_text[:20]!r}")
                size = int(size_text, 16)
                if size == 0:
                    self._chunk_state = "trailers"
                else:
                    self._chunk_left, self._chunk_state = size, "data"
            elif self._chunk_state == "data":
                take = min(self._chunk_left, len(buffer))
                if take == 0:
                    return
                self._keep(buffer[:take])
                del buffer[:take]
                self._chunk_left -= take
                if self._chunk_left:
                    return
                self._chunk_state = "data_crlf"
            elif self._chunk_state == "data_crlf":
                if len(buffer) < 2:
                    return
                if buffer[:2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                del buffer[:2]
                self._chunk_state = "size"
            else:  # trailers: header lines, then an empty line
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise ProtocolError("trailer section too large")
                    return
                del buffer[: end + 2]
                if end == 0:
                    self._answer()
                    return
            if self.waiter is None:
                return

    def _keep(self, data: bytes | bytearray) -> None:
        room = self._excerpt_limit + 1 - len(self._body)
        if room <= 0:
            return
        if self._inflate is not None:
            try:
                data = self._inflate.decompress(bytes(data), room)
            except zlib.error:
                self._inflate = None  # not what the header said: keep the raw bytes
        self._body += data[:room]

    # outcome --------------------------------------------------------------------------------
    def _answer(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():  # nobody waits for this response any more
            self.abort()
            return
        headers = _EMPTY_HEADERS
        if not 200 <= self._status < 300:  # classify reads Retry-After and Location
            pairs = (line.partition(b":") for line in self._fields.split(b"\r\n")[1:])
            headers = CIMultiDictProxy(
                CIMultiDict((n.decode("latin-1"), v.strip().decode("latin-1")) for n, _, v in pairs)
            )
        response = Response(self._status, headers, bytes(self._body))
        request, self.request = self.request, None
        if self._reusable and not self._buffer and not self.closed:
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
