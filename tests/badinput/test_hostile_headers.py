"""Odd bytes wherever the API reads the request line or a header (Authorization, Idempotency-Key,
Content-Type, query parameters, path parameters): bytes that are not UTF-8, NUL and other
control characters, very long values, numbers too large for any id. Each gets a 4xx answer as
`application/problem+json`, never a 500, and nothing is logged as an error with a traceback,
whether the HTTP parser or the application refuses it. Raw sockets: aiohttp's client would
refuse to send most of these."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.badinput.conftest import BODY_LIMIT_BYTES
from tests.harness import DaemonProcess

PROBLEM = "application/problem+json"
TOKEN = b"s3cret-token"
AUTH = b"Authorization: Bearer " + TOKEN + b"\r\n"
BODY = b'{"handler": "report"}'


@pytest.fixture(scope="module")
def module_daemon_env() -> dict[str, str]:
    return {
        "DISPATCHER_API_TOKENS": TOKEN.decode(),
        "DISPATCHER_BODY_LIMIT_BYTES": str(BODY_LIMIT_BYTES),
        "DISPATCHER_HANDLERS__REPORT__KIND": "python",
        "DISPATCHER_HANDLERS__REPORT__FUNCTION": "tests.badinput.handlers:noop",
        "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "0.001",
        "DISPATCHER_QUEUES__DEFAULT__BURST": "1",
    }


@pytest.fixture
async def quiet_log(module_daemon: DaemonProcess) -> AsyncIterator[None]:
    """Nothing the test sends is logged as an error or with a traceback."""
    offset = len(module_daemon.log_text())
    yield
    await asyncio.sleep(0.05)  # the log line of a refusal is written after the answer
    new = module_daemon.log_text()[offset:]
    assert "Traceback" not in new, new[-2000:]
    errors = [
        line
        for line in new.splitlines()
        if line.startswith("{") and json.loads(line)["level"] in ("error", "critical")
    ]
    assert not errors, errors[:3]


async def exchange(
    module_daemon: DaemonProcess, request: bytes
) -> tuple[int, dict[str, str], bytes]:
    """Send one raw request (the server closes after answering); return status, headers, body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", module_daemon.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split(" ")[1]), headers, body


def request(
    method: bytes = b"GET", target: bytes = b"/v1/jobs", headers: bytes = AUTH, body: bytes = b""
) -> bytes:
    length = b"Content-Length: %d\r\n" % len(body) if body else b""
    return (
        method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + headers + length + b"\r\n" + body
    )  # fmt: skip


def post_job(key_header: bytes, content_type: bytes = b"application/json") -> bytes:
    headers = AUTH + b"Content-Type: " + content_type + b"\r\n" + key_header
    return request(b"POST", b"/v1/jobs", headers, BODY)


def assert_problem(status: int, headers: dict[str, str], body: bytes, expected: int) -> Any:
    assert status == expected, (status, body[:300])
    assert headers.get("content-type", "").startswith(PROBLEM), (headers, body[:300])
    document = json.loads(body)
    assert document["status"] == status and document["detail"], document
    return document


@pytest.mark.parametrize(
    "authorization",
    [
        b"Bearer \xff\xfe",
        b"\xff",
        b"Bearer " + TOKEN + b"\xff",
        b"Bearer \xed\xa0\x80",  # an encoded surrogate
        b"Bearer " + "s3cret-tökén".encode(),
        b"Basic " + TOKEN,
        b"Bearer",
    ],
    ids=["ff-fe", "only-ff", "token-then-ff", "encoded-surrogate", "utf8", "basic", "no-token"],
)
async def test_a_bad_authorization_header_is_401_problem(
    module_daemon: DaemonProcess, quiet_log: None, authorization: bytes
) -> None:
    answer = await exchange(
        module_daemon, request(headers=b"Authorization: " + authorization + b"\r\n")
    )
    document = assert_problem(*answer, 401)
    assert "bearer token" in document["detail"]
    assert answer[1]["www-authenticate"] == 'Bearer realm="dispatcher"'


async def test_the_right_token_still_passes(module_daemon: DaemonProcess, quiet_log: None) -> None:
    status, _, body = await exchange(module_daemon, request())
    assert status == 200, body


@pytest.mark.parametrize(
    "header",
    [
        b"Authorization: Bearer a\x00b\r\n",
        b"Authorization: Bearer a\x01b\r\n",
        b"Authorization: Bearer a\x7fb\r\n",
        b"Authorization: Bearer " + b"a" * 9000 + b"\r\n",
        b"Idempotency-Key: a\x00b\r\n",
        b"Idempotency-Key: a\x1bb\r\n",
        b"Idempotency-Key: " + b"k" * 20_000 + b"\r\n",
        b"Content-Type: application/json\x00\r\n",
        b"X-Anything: \x00\r\n",
    ],
    ids=[
        "auth-nul",
        "auth-control",
        "auth-del",
        "auth-9kB",
        "key-nul",
        "key-escape",
        "key-20kB",
        "content-type-nul",
        "other-header-nul",
    ],
)
async def test_bytes_the_http_parser_refuses_are_a_400_problem(
    module_daemon: DaemonProcess, quiet_log: None, header: bytes
) -> None:
    """aiohttp's parser refuses these before any handler runs; the answer is still ours."""
    raw = request(b"POST", b"/v1/jobs", AUTH + header, BODY)
    document = assert_problem(*await exchange(module_daemon, raw), 400)
    assert "HTTP request" in document["detail"]


@pytest.mark.parametrize(
    "key",
    [b"\xff\xfe", b"caf\xc3\xa9", b"x" * 256, b"tab\there"],
    ids=["not-utf8", "non-ascii", "256-chars", "inner-tab"],
)
async def test_a_bad_idempotency_key_is_400_problem(
    module_daemon: DaemonProcess, quiet_log: None, key: bytes
) -> None:
    answer = await exchange(module_daemon, post_job(b"Idempotency-Key: " + key + b"\r\n"))
    assert "Idempotency-Key" in assert_problem(*answer, 400)["detail"]


@pytest.mark.parametrize("content_type", [b"\xff\xfe", b"application/json; charset=\xff"])
async def test_odd_bytes_in_content_type_are_never_a_5xx(
    module_daemon: DaemonProcess, quiet_log: None, content_type: bytes
) -> None:
    """The body decides (JSON in UTF-8); a Content-Type the API does not read cannot break it."""
    key = b"Idempotency-Key: ct-%d\r\n" % len(content_type)
    status, headers, body = await exchange(module_daemon, post_job(key, content_type))
    assert status == 202 or assert_problem(status, headers, body, status), (status, body)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (b"/v1/jobs?state=%FF%FE", 422),
        (b"/v1/jobs?state=%00", 422),
        (b"/v1/jobs?queue=%FF", 422),
        (b"/v1/jobs?queue=%00", 422),
        (b"/v1/jobs?limit=99999999999999999999", 422),
        (b"/v1/jobs?limit=%00", 422),
        (b"/v1/jobs?cursor=99999999999999999999", 422),
        (b"/v1/jobs?cursor=%FF", 422),
        (b"/v1/jobs?cursor=1%0A", 422),
        (b"/v1/jobs?state=\xff", 400),
        (b"/v1/jobs?state=" + b"a" * 9000, 400),
        (b"/v1/jobs/%FF", 404),
        (b"/v1/jobs/%00", 404),
        (b"/v1/jobs/1%0A", 404),
        (b"/v1/jobs/99999999999999999999", 404),
        (b"/v1/jobs/-1", 404),
        (b"/v1/jobs/\xff", 400),
        (b"/v1/jobs/" + b"9" * 9000, 400),
    ],
    ids=lambda v: v.decode("latin-1")[:40] if isinstance(v, bytes) else str(v),
)
async def test_odd_query_and_path_parameters_are_a_4xx_problem(
    module_daemon: DaemonProcess, quiet_log: None, target: bytes, expected: int
) -> None:
    assert_problem(*await exchange(module_daemon, request(target=target)), expected)


@pytest.mark.parametrize(
    "target",
    [b"/v1/jobs/%FF/retry", b"/v1/jobs/99999999999999999999/cancel", b"/v1/schedules/%FF/trigger"],
)
async def test_odd_path_parameters_of_actions_are_404_problem(
    module_daemon: DaemonProcess, quiet_log: None, target: bytes
) -> None:
    body = b'{"period_start": "2026-01-01T00:00:00Z"}'
    raw = request(b"POST", target, AUTH + b"Content-Type: application/json\r\n", body)
    assert_problem(*await exchange(module_daemon, raw), 404)
