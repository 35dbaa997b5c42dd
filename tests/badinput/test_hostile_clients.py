"""Hostile clients against a live daemon: oversize and chunked bodies, deep nesting, invalid
UTF-8, huge and numerous headers, garbage on the socket, slow-loris connections. Every one gets
a problem answer or a closed connection; none changes the jobs table or stops the daemon from
serving a normal client."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest

from tests.badinput.conftest import BODY_LIMIT_BYTES
from tests.harness import DaemonProcess

PROBLEM = "application/problem+json"


async def job_count(db_url: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM dispatcher.jobs")
    finally:
        await conn.close()


async def healthy(daemon: DaemonProcess) -> None:
    """The daemon still answers a normal client at once."""
    assert daemon.proc is not None and daemon.proc.returncode is None
    timeout = aiohttp.ClientTimeout(total=2)
    async with (
        aiohttp.ClientSession(timeout=timeout) as s,
        s.get(f"{daemon.base_url}/healthz") as r,
    ):
        assert r.status == 200


async def raw_exchange(daemon: DaemonProcess, request: bytes, timeout_s: float = 5) -> bytes:
    """Send raw bytes; return what the server answered before closing (or the timeout)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    try:
        writer.write(request)
        await writer.drain()
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            async with asyncio.timeout(timeout_s):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
                    if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                        break
        return b"".join(chunks)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return True


def status_of(answer: bytes) -> int:
    assert answer[:9] in (b"HTTP/1.0 ", b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


@pytest.fixture
async def unchanged(module_daemon: DaemonProcess, module_db_url: str) -> AsyncIterator[None]:
    """The jobs table has the same rows after the test, and the daemon is still healthy."""
    before = await job_count(module_db_url)
    yield
    assert await job_count(module_db_url) == before
    await healthy(module_daemon)


def post_request(body: bytes, *, extra: bytes = b"", path: bytes = b"/v1/jobs") -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nIdempotency-Key: hostile\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\n"
        + extra
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


@pytest.mark.parametrize("path", [b"/v1/jobs", b"/v1/jobs/batch"])
async def test_oversize_body_is_413_problem(
    module_daemon: DaemonProcess, unchanged: None, path: bytes
) -> None:
    body = b'{"handler": "report", "payload": {"x": "' + b"a" * BODY_LIMIT_BYTES + b'"}}'
    answer = await raw_exchange(module_daemon, post_request(body, path=path))
    assert status_of(answer) == 413, answer[:300]
    assert PROBLEM.encode() in answer and f"{BODY_LIMIT_BYTES} bytes".encode() in answer


async def test_oversize_chunked_body_is_413_problem(
    module_daemon: DaemonProcess, unchanged: None
) -> None:
    chunk = b"a" * 4096
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4)) + b"0\r\n\r\n"
    request = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nIdempotency-Key: chunky\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n" + body
    )
    answer = await raw_exchange(module_daemon, request)
    assert status_of(answer) == 413, answer[:300]
    assert PROBLEM.encode() in answer


@pytest.mark.parametrize(
    "body",
    [
        b"[" * (BODY_LIMIT_BYTES - 10),
        b'{"a":' * 1500,
        b'{"handler": "report", "payload": {"deep": ' + b"[" * 3000 + b"]" * 3000 + b"}}",
    ],
    ids=["arrays", "objects", "inside-payload"],
)
async def test_deep_json_nesting_is_400_problem(
    module_daemon: DaemonProcess, unchanged: None, body: bytes
) -> None:
    answer = await raw_exchange(module_daemon, post_request(body))
    assert status_of(answer) == 400, answer[:300]
    assert PROBLEM.encode() in answer and b"nests JSON too deeply" in answer


async def test_nesting_just_below_the_parser_limit_is_never_a_5xx(
    module_daemon: DaemonProcess,
) -> None:
    """Deep but parseable payloads travel through validation, hashing and the driver's JSON
    encoder: each is stored (202) or refused with a problem, never a crash. Python's parser
    gives up near depth 1,000, and the encoder, deeper in the stack, a little earlier."""
    statuses: dict[int, int] = {}
    for depth in [100, 400, 800, *range(940, 1000)]:
        body = b'{"handler": "report", "payload": {"deep": ' + b"[" * depth + b"]" * depth + b"}}"
        request = post_request(body).replace(
            b"Idempotency-Key: hostile", b"Idempotency-Key: deep-%d" % depth
        )
        statuses[depth] = status_of(await raw_exchange(module_daemon, request))
    crashed = {d: s for d, s in statuses.items() if s not in (202, 400, 422)}
    assert not crashed, f"depths answered with a 5xx: {crashed}"
    await healthy(module_daemon)


@pytest.mark.parametrize(
    "body",
    [
        b'{"handler": "report", "tenant": "\xff\xfe"}',
        b'{"handler": "report", "payload": {"k": "\xc3\x28"}}',
        # an encoded surrogate is not UTF-8 (json.loads would decode it with 'surrogatepass')
        b'{"handler": "report", "payload": {"k": "\xed\xa0\x80"}}',
    ],
    ids=["ff-fe", "bad-continuation", "encoded-surrogate"],
)
async def test_invalid_utf8_is_400_problem(
    module_daemon: DaemonProcess, unchanged: None, body: bytes
) -> None:
    answer = await raw_exchange(module_daemon, post_request(body))
    assert status_of(answer) == 400, answer[:300]
    assert PROBLEM.encode() in answer and b"UTF-8" in answer


@pytest.mark.parametrize(
    "extra",
    [
        b"X-Huge: " + b"a" * 100_000 + b"\r\n",
        b"".join(b"X-Many-%d: v\r\n" % i for i in range(500)),
        b"Idempotency-Key: " + b"k" * 20_000 + b"\r\n",
    ],
    ids=["one-100kB-header", "500-headers", "20kB-idempotency-key"],
)
async def test_huge_headers_are_refused_and_the_daemon_stays_healthy(
    module_daemon: DaemonProcess, unchanged: None, extra: bytes
) -> None:
    answer = await raw_exchange(module_daemon, post_request(b'{"handler": "report"}', extra=extra))
    # aiohttp's parser limits (8190-byte lines and fields, 128 headers) answer before routing
    assert answer == b"" or status_of(answer) in (400, 413, 431), answer[:300]


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /v1/jobs HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/jobs HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"\r\n" * 5000 + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
    ],
    ids=["tls-hello", "http-9.9", "negative-length", "two-lengths", "blank-lines"],
)
async def test_garbage_on_the_socket_is_refused(
    module_daemon: DaemonProcess, unchanged: None, garbage: bytes
) -> None:
    answer = await raw_exchange(module_daemon, garbage, timeout_s=3)
    assert answer == b"" or status_of(answer) in (200, 400), answer[:300]


async def test_slow_loris_connections_do_not_starve_normal_clients(
    module_daemon: DaemonProcess,
) -> None:
    """200 connections each trickle a request one byte at a time; a normal client is served
    at once throughout.

    Trickled bodies get a 408 after `body_read_timeout_s` (test_slow_body.py).
    aiohttp has no separate timeout for request headers: a connection that never completes
    them is closed by the keep-alive timeout, which the daemon sets to 75 s from the connect.
    The connections here are still open when the test ends; asyncio keeps serving others, so
    the cost is sockets and file descriptors, not latency."""
    request = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"{" * 1000
    connections = [
        await asyncio.open_connection("127.0.0.1", module_daemon.port) for _ in range(200)
    ]
    latencies: list[float] = []
    try:
        for step in range(30):
            for _, writer in connections:
                writer.write(request[step : step + 1])
            started = time.monotonic()
            await healthy(module_daemon)
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.1)  # the trickle's pace, not a synchronisation
        open_after = sum(1 for reader, _ in connections if not reader.at_eof())
    finally:
        for _, writer in connections:
            writer.close()
    print(
        f"\nslow loris: 200 trickling connections, /healthz max {max(latencies) * 1000:.0f} ms;"
        f" {open_after} of 200 still open by the server after ~3 s"
    )
    assert max(latencies) < 1.0
