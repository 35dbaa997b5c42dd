"""The http effect's HTTP/1.1 client against real loopback servers that answer with exact
bytes: framing (Content-Length, chunked, until close, 1xx), keep-alive reuse and when a
connection must not be reused, the connection limit, deadlines and cancellation."""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from dispatcher.effects.httpclient import (
    KEEPALIVE_S,
    ConnectError,
    HttpClient,
    Origin,
    ProtocolError,
    ServerDisconnected,
)
from dispatcher.effects.ssrf import GuardedResolver, TargetPolicy, TargetRefused

DEADLINE_S = 10.0

# what a scripted server does with one request: the bytes it writes back (None: stay silent)
Script = Callable[[bytes], Awaitable[bytes | None]]


@dataclass
class RawServer:
    """A loopback server answering each request (head and Content-Length body) by `script`;
    counts connections and the most open at once."""

    script: Script
    port: int = 0
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    requests: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        self.writers.append(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = await self.script(request)
                if answer is None:
                    await asyncio.sleep(3600)
                    return
                writer.write(answer)
                try:
                    await writer.drain()
                except ConnectionError:  # the client stopped reading (it had its excerpt)
                    return
                if b"connection: close" in answer.lower():
                    return
        finally:
            self.open_now -= 1
            writer.close()


def response(status: int = 200, body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


def fixed(answer: bytes) -> Script:
    async def script(request: bytes) -> bytes | None:
        return answer

    return script


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[RawServer]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> RawServer:
        raw = RawServer(script)
        server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
        servers.append(server)
        raw.port = server.sockets[0].getsockname()[1]
        return raw

    yield start
    for server in servers:
        server.close()


@pytest.fixture
async def client() -> AsyncIterator[Callable[..., HttpClient]]:
    made: list[tuple[HttpClient, GuardedResolver]] = []

    def make(max_connections: int = 10, allow: tuple[str, ...] = ("127.0.0.0/8",)) -> HttpClient:
        policy = TargetPolicy(tuple(ipaddress.ip_network(c) for c in allow), allow_http=True)
        resolver = GuardedResolver(policy)
        http = HttpClient(resolver, policy, ssl.create_default_context(), max_connections)
        made.append((http, resolver))
        return http

    yield make
    for c, resolver in made:
        await c.close()
        await resolver.close()


def request(port: int, body: bytes = b"{}") -> bytes:
    return b"POST /hook HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n\r\n%s" % (
        port,
        len(body),
        body,
    )


def origin(port: int) -> Origin:
    return Origin(False, "127.0.0.1", port)


async def test_sequential_requests_reuse_one_connection(serve, client) -> None:
    server = await serve(fixed(response(200, b'{"ok":true}')))
    http = client()
    for _ in range(5):
        answer = await http.request(origin(server.port), request(server.port), 5.0, 64)
        assert (answer.status, answer.excerpt) == (200, b'{"ok":true}')
    assert server.connections == 1
    assert len(server.requests) == 5


async def test_a_whole_body_read_with_its_excerpt_keeps_the_connection(serve, client) -> None:
    server = await serve(fixed(response(200, b"y" * 5000)))  # arrives in one read
    http = client()
    for _ in range(2):
        answer = await http.request(origin(server.port), request(server.port), 5.0, 32)
        assert answer.excerpt == b"y" * 33
    assert server.connections == 1


async def test_chunked_body_is_read_and_the_connection_reused(serve, client) -> None:
    chunked = (
        b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\nRetry-After: 7\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    server = await serve(fixed(chunked))
    http = client()
    first = await http.request(origin(server.port), request(server.port), 5.0, 64)
    second = await http.request(origin(server.port), request(server.port), 5.0, 64)
    assert (first.status, first.excerpt, first.headers["retry-after"]) == (500, b"hello world", "7")
    assert second.excerpt == b"hello world"
    assert server.connections == 1


async def test_a_body_still_arriving_past_the_excerpt_ends_the_connection(serve, client) -> None:
    # larger than any one read: the excerpt is complete before the body is
    server = await serve(fixed(response(200, b"x" * 4_000_000)))
    http = client()
    for _ in range(2):
        answer = await http.request(origin(server.port), request(server.port), 5.0, 32)
        assert answer.excerpt == b"x" * 33  # one byte more tells the caller it is truncated
    assert server.connections == 2


async def test_informational_responses_are_skipped(serve, client) -> None:
    server = await serve(fixed(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + response(201)))
    answer = await client().request(origin(server.port), request(server.port), 5.0, 64)
    assert (answer.status, answer.excerpt) == (201, b"ok")


async def test_body_until_close_and_http_1_0_are_not_reused(serve, client) -> None:
    server = await serve(fixed(b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nall of it"))
    http = client()
    for _ in range(2):
        answer = await http.request(origin(server.port), request(server.port), 5.0, 64)
        assert (answer.status, answer.excerpt) == (200, b"all of it")
    assert server.connections == 2


async def test_both_framings_never_reuse_the_connection(serve, client) -> None:
    smuggle = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n"
    )
    server = await serve(fixed(smuggle))
    http = client()
    for _ in range(2):
        assert (
            await http.request(origin(server.port), request(server.port), 5, 64)
        ).excerpt == b"ok"
    assert server.connections == 2


async def test_gzip_excerpt_is_decoded(serve, client) -> None:
    body = gzip.compress(b'{"error":"bad"}')
    server = await serve(fixed(response(400, body, b"Content-Encoding: gzip\r\n")))
    answer = await client().request(origin(server.port), request(server.port), 5.0, 64)
    assert (answer.status, answer.excerpt) == (400, b'{"error":"bad"}')


@pytest.mark.parametrize(
    "answer",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header line\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length : 1\r\n\r\nx",  # a space before the colon
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",  # obsolete line folding
    ],
)
async def test_malformed_heads_are_protocol_errors(serve, client, answer: bytes) -> None:
    server = await serve(fixed(answer))
    with pytest.raises(ProtocolError):
        await client().request(origin(server.port), request(server.port), 5.0, 64)


@pytest.mark.parametrize("size", [b"0x5", b"+5", b"5_0", b"", b"g", b"1" * 17])
async def test_malformed_chunk_sizes_are_protocol_errors(serve, client, size: bytes) -> None:
    server = await serve(
        fixed(
            b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\n"
            + size
            + b"\r\nhello\r\n0\r\n\r\n"
        )
    )
    http = client()
    answer = await http.request(origin(server.port), request(server.port), 5.0, 64)
    # the head was valid, so the status stands; the body is not read past the bad size line
    assert (answer.status, answer.excerpt) == (500, b"")
    assert server.connections == 1
    second = await http.request(origin(server.port), request(server.port), 5.0, 64)
    assert second.status == 500
    assert server.connections == 2  # the first connection was not reused


async def test_a_head_past_the_limit_is_a_protocol_error(serve, client) -> None:
    server = await serve(fixed(b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n"))
    with pytest.raises(ProtocolError, match="larger than"):
        await client().request(origin(server.port), request(server.port), 5.0, 64)


async def test_closed_before_answering_is_server_disconnected(serve, client) -> None:
    server = await serve(fixed(b""))

    async def close_at_once(request: bytes) -> bytes | None:
        server.writers[-1].close()
        return b""

    server.script = close_at_once
    with pytest.raises(ServerDisconnected):
        await client().request(origin(server.port), request(server.port), 5.0, 64)


async def test_a_server_that_closes_an_idle_connection_gets_a_new_one(serve, client) -> None:
    server = await serve(fixed(response(200)))
    http = client()
    await http.request(origin(server.port), request(server.port), 5.0, 64)
    server.writers[-1].close()  # the server ends the idle connection (its keep-alive ran out)
    await wait_until(lambda: server.open_now == 0)
    await asyncio.sleep(0.05)  # the client's end sees the FIN
    answer = await http.request(origin(server.port), request(server.port), 5.0, 64)
    assert answer.status == 200
    assert server.connections == 2


async def test_silence_after_the_request_times_out(serve, client) -> None:
    async def silent(request: bytes) -> bytes | None:
        return None

    server = await serve(silent)
    http = client()
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError, match=r"within 0\.2 s"):
        await http.request(origin(server.port), request(server.port), 0.2, 64)
    assert asyncio.get_running_loop().time() - started < 2.0


async def test_a_reused_connection_times_out_too(serve, client) -> None:
    answers = iter([response(200), None])

    async def then_silent(request: bytes) -> bytes | None:
        return next(answers)

    server = await serve(then_silent)
    http = client()
    await http.request(origin(server.port), request(server.port), 0.3, 64)
    with pytest.raises(TimeoutError):
        await http.request(origin(server.port), request(server.port), 0.3, 64)
    assert server.connections == 1  # the pooled connection took the second request


async def test_a_head_then_a_stalled_body_answers_with_the_excerpt_at_the_deadline(
    serve, client
) -> None:
    server = await serve(fixed(b"HTTP/1.1 202 OK\r\nContent-Length: 100\r\n\r\npartial"))
    answer = await client().request(origin(server.port), request(server.port), 0.3, 64)
    assert (answer.status, answer.excerpt) == (202, b"partial")


async def test_at_most_max_connections_are_open_at_once(serve, client) -> None:
    async def slow(request: bytes) -> bytes | None:
        await asyncio.sleep(0.05)
        return response(200)

    server = await serve(slow)
    http = client(max_connections=3)
    answers = await asyncio.gather(
        *(http.request(origin(server.port), request(server.port), 5.0, 64) for _ in range(12))
    )
    assert [a.status for a in answers] == [200] * 12
    assert server.most_open <= 3
    assert server.connections == 3


async def test_a_cancelled_request_never_leaves_its_connection_in_the_pool(serve, client) -> None:
    release = asyncio.Event()

    async def late(request: bytes) -> bytes | None:
        await release.wait()
        return response(200, b"late")

    server = await serve(late)
    http = client(max_connections=1)
    task = asyncio.create_task(http.request(origin(server.port), request(server.port), 5.0, 64))
    await wait_until(lambda: len(server.requests) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()  # the late answer goes out; the server then finds the connection closed
    await wait_until(lambda: server.open_now == 0)
    server.script = fixed(response(200, b"fresh"))
    answer = await http.request(origin(server.port), request(server.port), 5.0, 64)
    assert answer.excerpt == b"fresh"  # not the late answer to the cancelled request
    assert server.connections == 2


async def test_waiting_for_a_slot_counts_against_the_deadline(serve, client) -> None:
    async def silent(request: bytes) -> bytes | None:
        return None

    server = await serve(silent)
    http = client(max_connections=1)
    first = asyncio.create_task(http.request(origin(server.port), request(server.port), 5.0, 64))
    await wait_until(lambda: len(server.requests) == 1)
    with pytest.raises(TimeoutError, match=r"no connection within 0\.2 s"):
        await http.request(origin(server.port), request(server.port), 0.2, 64)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_waiting_request_is_sent_on_the_connection_just_answered(serve, client) -> None:
    release = asyncio.Event()

    async def held(request: bytes) -> bytes | None:
        await release.wait()
        return response(200, request[-2:])

    server = await serve(held)
    http = client(max_connections=1)
    first = asyncio.create_task(
        http.request(origin(server.port), request(server.port, b"r1"), 5.0, 64)
    )
    await wait_until(lambda: len(server.requests) == 1)
    second = asyncio.create_task(
        http.request(origin(server.port), request(server.port, b"r2"), 5.0, 64)
    )
    release.set()
    assert [(await first).excerpt, (await second).excerpt] == [b"r1", b"r2"]
    assert server.connections == 1


async def test_a_waiting_request_to_another_origin_connects_when_a_slot_frees(
    serve, client
) -> None:
    release = asyncio.Event()

    async def held(request: bytes) -> bytes | None:
        await release.wait()
        return response(200, b"a")

    first_server, other = await serve(held), await serve(fixed(response(200, b"b")))
    http = client(max_connections=1)
    first = asyncio.create_task(
        http.request(origin(first_server.port), request(first_server.port), 5.0, 64)
    )
    await wait_until(lambda: len(first_server.requests) == 1)
    second = asyncio.create_task(http.request(origin(other.port), request(other.port), 5.0, 64))
    await asyncio.sleep(0)
    assert other.connections == 0  # the only slot is taken
    release.set()
    assert [(await first).excerpt, (await second).excerpt] == [b"a", b"b"]
    assert (first_server.connections, other.connections) == (1, 1)


async def test_waiters_that_gave_up_are_skipped_and_no_slot_is_lost(serve, client) -> None:
    release = asyncio.Event()

    async def held(request: bytes) -> bytes | None:
        await release.wait()
        return response(200, request[-2:])

    server = await serve(held)
    http = client(max_connections=2)
    to = origin(server.port)
    busy = [
        asyncio.create_task(http.request(to, request(server.port, b"b%d" % i), 5.0, 64))
        for i in range(2)
    ]
    await wait_until(lambda: len(server.requests) == 2)
    cancelled = asyncio.create_task(http.request(to, request(server.port, b"c1"), 5.0, 64))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(TimeoutError, match="no connection within"):
        await http.request(to, request(server.port, b"t1"), 0.1, 64)
    last = asyncio.create_task(http.request(to, request(server.port, b"w1"), 5.0, 64))
    release.set()
    assert [(await t).excerpt for t in busy] == [b"b0", b"b1"]
    assert (await last).excerpt == b"w1"
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert [r[-2:] for r in server.requests] == [b"b0", b"b1", b"w1"]
    # both slots are free again: two requests held by the server at once
    release.clear()
    again = [
        asyncio.create_task(http.request(to, request(server.port, b"a%d" % i), 5.0, 64))
        for i in range(2)
    ]
    await wait_until(lambda: len(server.requests) == 5)
    release.set()
    assert [(await t).excerpt for t in again] == [b"a0", b"a1"]
    assert server.connections == 2


async def test_connection_refused_is_a_connect_error(client) -> None:
    with pytest.raises(ConnectError, match=r"cannot connect to 127\.0\.0\.1:1"):
        await client().request(origin(1), request(1), 5.0, 64)


async def test_a_literal_address_is_checked_again_before_connecting(serve, client) -> None:
    server = await serve(fixed(response()))
    with pytest.raises(TargetRefused):
        await client(allow=()).request(origin(server.port), request(server.port), 5.0, 64)
    assert server.connections == 0


async def test_a_name_resolving_to_a_refused_address_never_connects(serve, client) -> None:
    server = await serve(fixed(response()))
    named = Origin(False, "localhost", server.port)
    with pytest.raises(TargetRefused):
        await client(allow=()).request(named, request(server.port), 5.0, 64)
    assert server.connections == 0


def test_keepalive_is_bounded() -> None:
    assert 0 < KEEPALIVE_S <= 60


async def wait_until(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    """Poll `condition` (state of a server in this loop) until it holds, within a deadline."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 (a plain condition, nothing to wait on)
            await asyncio.sleep(0.01)
