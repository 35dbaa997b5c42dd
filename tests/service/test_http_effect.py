"""The HTTP effect against real loopback targets (plain and TLS): signing, idempotency headers,
response classification, timeouts, connection failures and the SSRF guard."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from dispatcher.config.settings import Settings
from dispatcher.effects.base import Delivered
from dispatcher.effects.http import HttpEffect
from dispatcher.effects.ssrf import GuardedResolver, TargetPolicy
from dispatcher.errors import Reject, RetryLater
from dispatcher.model import Job
from dispatcher.observability.metrics import REGISTRY
from tests.harness import free_port

SECRET = "whsec_" + base64.b64encode(b"service test signing key 32 byte").decode()
LOOPBACK_CIDRS = ["127.0.0.0/8", "::1/128"]
DEADLINE_S = 10.0

Responder = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Target:
    """A loopback server that records each request and answers with `respond`."""

    url: str
    respond: Responder
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path, dict(request.headers), body))
        return await self.respond(request)


def reply(status: int = 200, body: str = "", headers: dict[str, str] | None = None) -> Responder:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text=body, headers=headers)

    return respond


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "target_allow_cidrs": LOOPBACK_CIDRS,
        "target_allow_http": True,
        "http": {"signing_secret": SECRET, "response_excerpt_bytes": 32},
    }
    values.update(overrides)
    return Settings.model_validate(values)


def make_job(target: dict[str, Any], *, key: str = "order-42", attempt: int = 1) -> Job:
    return Job(
        id=1,
        key=key,
        queue="default",
        tenant="acme",
        handler="http",
        handler_version=1,
        target=target,
        payload={"order": 42, "items": ["a", "b"], "note": "café"},
        attempt=attempt,
        max_attempts=5,
        due_at=datetime.now(UTC),
        progress=None,
        run_key=None,
        due_to_start_s=0.0,
    )


def responses(status_class: str) -> float:
    value = REGISTRY.get_sample_value(
        "dispatcher_http_responses_total", {"queue": "default", "class": status_class}
    )
    return value or 0.0


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def client_ssl(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@pytest.fixture
async def serve(ca: trustme.CA) -> AsyncIterator[Callable[..., Awaitable[Target]]]:
    async with AsyncExitStack() as stack:

        async def start(respond: Responder | None = None, *, tls: bool = False) -> Target:
            target = Target("", respond or reply(200, "ok"))
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", target.handle)
            runner = web.AppRunner(app, shutdown_timeout=1.0)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            stack.callback(target.release.set)  # unblock handlers first (LIFO)
            context = None
            if tls:
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
            await site.start()
            port = runner.addresses[0][1]
            target.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
            return target

        yield start


@pytest.fixture
async def effects(
    client_ssl: ssl.SSLContext,
) -> AsyncIterator[Callable[..., Awaitable[HttpEffect]]]:
    async with AsyncExitStack() as stack:

        async def start(config: Settings | None = None, **kwargs: Any) -> HttpEffect:
            effect = HttpEffect(config or settings(), ssl_context=client_ssl, **kwargs)
            await effect.start()
            stack.push_async_callback(effect.stop)
            return effect

        yield start


async def test_signed_push_over_tls_is_verified_by_standard_webhooks(serve, effects) -> None:
    target = await serve(tls=True)
    effect = await effects()
    before = responses("2xx")
    job = make_job({"url": target.url + "/hook", "headers": {"Authorization": "Bearer t0k"}})
    payload = job.payload

    assert await effect.run(job, None) == {"status": 200}

    assert job.payload == {}  # the request carried it: the decoded copy was let go (issue 20)
    [seen] = target.seen
    assert (seen.method, seen.path) == ("POST", "/hook")
    assert seen.body == json.dumps(payload, separators=(",", ":")).encode()
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["Idempotency-Key"] == seen.headers["webhook-id"] == "order-42"
    assert seen.headers["Authorization"] == "Bearer t0k"
    assert seen.headers["User-Agent"] == "dispatcher"
    assert Webhook(SECRET).verify(seen.body, seen.headers) == payload
    assert responses("2xx") == before + 1


async def test_tls_target_by_host_name_goes_through_the_guarded_resolver(serve, effects) -> None:
    target = await serve(tls=True)
    effect = await effects()
    url = target.url.replace("127.0.0.1", "localhost")
    assert await effect.run(make_job({"url": url, "method": "put"}), None) == {"status": 200}
    assert target.seen[0].method == "PUT"


async def test_every_attempt_carries_the_same_idempotency_key(serve, effects) -> None:
    answers = iter([reply(500, "try again"), reply(204)])
    target = await serve(lambda request: next(answers)(request))
    effect = await effects()

    with pytest.raises(RetryLater):
        await effect.run(make_job({"url": target.url}, attempt=1), None)
    assert await effect.run(make_job({"url": target.url}, attempt=2), None) == {"status": 204}

    first, second = target.seen
    for seen in (first, second):
        assert seen.headers["Idempotency-Key"] == seen.headers["webhook-id"] == "order-42"
        Webhook(SECRET).verify(seen.body, seen.headers)
    assert first.body == second.body


async def test_unsigned_when_no_secret_is_configured(serve, effects) -> None:
    target = await serve()
    effect = await effects(settings(http={}))
    await effect.run(make_job({"url": target.url}), None)
    headers = target.seen[0].headers
    assert headers["webhook-id"] == "order-42"
    assert int(headers["webhook-timestamp"]) == pytest.approx(time.time(), abs=60)
    assert "webhook-signature" not in headers


async def test_429_with_retry_after_seconds_is_rate_limited(serve, effects) -> None:
    target = await serve(reply(429, "slow down", {"Retry-After": "2"}))
    effect = await effects()
    with pytest.raises(RetryLater) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert (caught.value.delay_s, caught.value.rate_limited) == (2.0, True)
    assert "HTTP 429" in caught.value.reason
    assert "slow down" in caught.value.reason


async def test_retry_after_as_http_date(serve, effects) -> None:
    now = float(int(time.time()))
    target = await serve(reply(429, headers={"Retry-After": formatdate(now + 120, usegmt=True)}))
    effect = await effects(clock=lambda: now)
    with pytest.raises(RetryLater) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert caught.value.delay_s == 120.0
    assert caught.value.rate_limited


@pytest.mark.parametrize(
    ("retry_after", "delay_s"),
    [
        ("soon", None),
        ("1.5", None),
        ("", None),
        ("-5", 0.0),
        # no cap of its own any more (it was one day): the job's retry age decides
        ("999999999", 999_999_999.0),
        ("9" * 400, math.inf),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
async def test_retry_after_is_read_without_a_cap(
    serve, effects, retry_after: str, delay_s: Any
) -> None:
    target = await serve(reply(429, headers={"Retry-After": retry_after}))
    effect = await effects()
    with pytest.raises(RetryLater) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert caught.value.delay_s == delay_s
    # an unreadable value is ignored: the queue's backoff, not the target's request
    assert (caught.value.retry_after, caught.value.rate_limited) == (delay_s is not None, True)
    assert caught.value.http_status == 429


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_retry_after_on_a_server_error_is_the_targets_request(
    serve, effects, status: int
) -> None:
    now = float(int(time.time()))
    when = formatdate(now + 7200, usegmt=True)
    for value, delay_s in (("90", 90.0), (when, 7200.0)):
        target = await serve(reply(status, "busy", {"Retry-After": value}))
        effect = await effects(clock=lambda: now)
        with pytest.raises(RetryLater) as caught:
            await effect.run(make_job({"url": target.url}), None)
        assert (caught.value.delay_s, caught.value.retry_after) == (delay_s, True)
        assert caught.value.rate_limited == (status == 503)
        assert (caught.value.http_status, caught.value.reason) == (status, f"HTTP {status}: busy")


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_with_retry_after_is_retried_then_not_rejected(
    serve, effects, status: int
) -> None:
    target = await serve(reply(status, headers={"Location": "/elsewhere", "Retry-After": "600"}))
    effect = await effects()
    with pytest.raises(RetryLater) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert (caught.value.delay_s, caught.value.retry_after) == (600.0, True)
    assert caught.value.http_status == status
    assert "redirect to /elsewhere not followed; the target asked to retry after 600 s" in (
        caught.value.reason
    )


async def test_retry_after_is_not_read_on_other_client_errors(serve, effects) -> None:
    target = await serve(reply(400, "no", {"Retry-After": "60"}))
    effect = await effects()
    with pytest.raises(Reject) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert (caught.value.code, caught.value.http_status) == ("http_4xx", 400)


async def test_a_success_carries_its_status_and_response_start_for_the_history(
    serve, effects
) -> None:
    target = await serve(reply(201, "y" * 100))
    effect = await effects()
    result = await effect.run(make_job({"url": target.url}), None)
    assert result == {"status": 201}  # the job's stored result is unchanged
    assert isinstance(result, Delivered)
    # bounded by response_excerpt_bytes (32) and marked as cut
    assert (result.http_status, result.excerpt) == (201, "y" * 32 + "…")


async def test_503_without_retry_after_uses_the_queue_backoff(serve, effects) -> None:
    target = await serve(reply(503))
    effect = await effects()
    with pytest.raises(RetryLater) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert (caught.value.delay_s, caught.value.rate_limited) == (None, True)


@pytest.mark.parametrize("status", [500, 502, 408])
async def test_server_errors_are_transient(serve, effects, status: int) -> None:
    target = await serve(reply(status, "x" * 100))
    effect = await effects()
    before = responses(f"{status // 100}xx")
    with pytest.raises(RetryLater) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert (caught.value.delay_s, caught.value.rate_limited) == (None, False)
    # The stored excerpt is bounded by response_excerpt_bytes (32) and marked as cut.
    assert caught.value.reason == f"HTTP {status}: {'x' * 32}…"
    assert responses(f"{status // 100}xx") == before + 1


async def test_client_errors_reject(serve, effects) -> None:
    target = await serve(reply(400, '{"error":"bad order"}'))
    effect = await effects()
    with pytest.raises(Reject) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert caught.value.code == "http_4xx"
    assert caught.value.reason == 'HTTP 400: {"error":"bad order"}'


async def test_redirect_is_not_followed(serve, effects) -> None:
    elsewhere = await serve()
    target = await serve(reply(302, headers={"Location": elsewhere.url + "/moved"}))
    effect = await effects()
    with pytest.raises(Reject) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert caught.value.code == "http_3xx"
    assert f"redirect to {elsewhere.url}/moved not followed" in caught.value.reason
    assert len(target.seen) == 1
    assert elsewhere.seen == []


async def test_slow_target_times_out_as_transient(serve, effects) -> None:
    async def stall(request: web.Request) -> web.StreamResponse:
        await asyncio.wait_for(target.release.wait(), DEADLINE_S)
        return web.Response()

    target = await serve(stall)
    effect = await effects()
    before = responses("error")
    started = time.monotonic()
    with pytest.raises(RetryLater) as caught:
        await effect.run(make_job({"url": target.url, "timeout_s": 0.3}), None)
    assert time.monotonic() - started < 5
    assert "within 0.3 s" in caught.value.reason
    assert responses("error") == before + 1


async def test_connection_refused_is_transient(effects) -> None:
    effect = await effects()
    with pytest.raises(RetryLater) as caught:
        await effect.run(make_job({"url": f"http://127.0.0.1:{free_port()}/"}), None)
    assert "Connect" in caught.value.reason


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://169.254.169.254/latest/meta-data/", "metadata"),
        ("https://10.0.0.1/", "private"),
        ("https://[::ffff:127.0.0.1]/", "loopback"),
    ],
)
async def test_internal_literal_addresses_are_refused(effects, url: str, why: str) -> None:
    effect = await effects(Settings())
    # Refusal comes before any connection: a connection attempt would end in RetryLater.
    with pytest.raises(Reject) as caught:
        await asyncio.wait_for(effect.run(make_job({"url": url}), None), DEADLINE_S)
    assert caught.value.code == "target_refused"
    assert why in caught.value.reason


async def test_name_resolving_to_loopback_is_refused_by_the_resolver(serve, effects) -> None:
    target = await serve()
    effect = await effects(Settings(target_allow_http=True))
    url = target.url.replace("127.0.0.1", "localhost")
    with pytest.raises(Reject) as caught:
        await effect.run(make_job({"url": url}), None)
    assert caught.value.code == "target_refused"
    assert "localhost resolves to it" in caught.value.reason
    assert target.seen == []


async def test_literal_loopback_is_refused_without_allow_list(serve, effects) -> None:
    target = await serve()
    effect = await effects(Settings(target_allow_http=True))
    with pytest.raises(Reject) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert caught.value.code == "target_refused"
    assert target.seen == []


async def test_allow_listed_loopback_over_http_is_reached(serve, effects) -> None:
    target = await serve()
    effect = await effects(Settings(target_allow_cidrs=LOOPBACK_CIDRS, target_allow_http=True))
    url = target.url.replace("127.0.0.1", "localhost")
    assert await effect.run(make_job({"url": url}), None) == {"status": 200}
    assert len(target.seen) == 1


async def test_plain_http_is_refused_unless_allowed(serve, effects) -> None:
    target = await serve()
    effect = await effects(Settings(target_allow_cidrs=LOOPBACK_CIDRS))
    with pytest.raises(Reject) as caught:
        await effect.run(make_job({"url": target.url}), None)
    assert caught.value.code == "target_refused"
    assert "plain http" in caught.value.reason
    assert target.seen == []


async def test_aiohttp_skips_the_resolver_for_literal_ips(serve) -> None:
    # Why check_url must run on every attempt: aiohttp connects to a literal IP directly.
    target = await serve()
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(TargetPolicy()))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(target.url) as response,
    ):
        assert response.status == 200


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (None, "needs target"),
        ({}, "target.url is required"),
        ({"url": 5}, "target.url is required"),
        ({"url": "https://example.com", "retries": 3}, "unknown keys ['retries']"),
        ({"url": "https://example.com", "method": "GET"}, "target.method 'GET'"),
        ({"url": "https://example.com", "headers": ["x"]}, "target.headers must be an object"),
        ({"url": "https://example.com", "headers": {"Idempotency-Key": "x"}}, "cannot be"),
        ({"url": "https://example.com", "headers": {"Webhook-Signature": "x"}}, "cannot be"),
        ({"url": "https://example.com", "headers": {"content-type": "x"}}, "cannot be"),
        ({"url": "https://example.com", "headers": {"Host": "x"}}, "cannot be"),
        ({"url": "https://example.com", "headers": {"X-A": 1}}, "must be a string"),
        ({"url": "https://example.com", "headers": {"X-A": "a\r\nB: c"}}, "line breaks"),
        ({"url": "https://example.com", "headers": {"bad name": "x"}}, "valid header name"),
        ({"url": "https://example.com", "headers": {"X-A\n": "x"}}, "valid header name"),
        ({"url": "https://example.com", "timeout_s": 0}, "timeout_s must be"),
        ({"url": "https://example.com", "timeout_s": 901}, "<= 900"),
        ({"url": "https://example.com", "timeout_s": True}, "timeout_s must be"),
        ({"url": "https://example.com", "timeout_s": "5"}, "timeout_s must be"),
        ({"url": "http://example.com"}, "target.url: plain http"),
        ({"url": "https://10.0.0.1/"}, "target.url: address 10.0.0.1 is private"),
        ({"url": "https://u:p@example.com/"}, "credentials"),
    ],
)
def test_validate_target_says_what_to_fix(target: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        HttpEffect.validate_target(target, Settings())


def test_validate_target_fills_in_defaults() -> None:
    assert HttpEffect.validate_target({"url": "https://example.com/h"}, Settings()) == {
        "url": "https://example.com/h",
        "method": "POST",
        "headers": {},
        "timeout_s": 30.0,
    }


async def test_invalid_stored_target_is_rejected(effects) -> None:
    effect = await effects()
    with pytest.raises(Reject) as caught:
        await effect.run(make_job({"url": "https://example.com", "method": "GET"}), None)
    assert caught.value.code == "invalid_target"


async def test_stop_is_idempotent(effects) -> None:
    effect = await effects()
    await effect.stop()
    await effect.stop()
