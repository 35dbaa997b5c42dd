"""dispatcher.client.webhooks on each framework it names, each served for real on loopback
(aiohttp in this loop, FastAPI under uvicorn and Flask under Werkzeug in threads): a real
daemon's signed push is accepted by a receiver that holds the old and the new secret (rotation),
and a push signed otherwise, tampered with, replayed late or unsigned is answered 401."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dispatcher.client import AsyncClient
from dispatcher.client.webhooks import (
    InvalidSignature,
    WebhookVerifier,
    aiohttp_payload,
    fastapi_dependency,
    flask_payload,
)
from dispatcher.effects.signing import webhook_headers
from tests.harness import free_port, make_settings, running_daemon, wait_until

pytestmark = pytest.mark.timeout(120)

CURRENT = "whsec_" + base64.b64encode(b"the current secret, 32 bytes...").decode()
OLD = "whsec_" + base64.b64encode(b"the secret before the rotation..").decode()
STRANGER = "whsec_" + base64.b64encode(b"a secret nobody configured......").decode()


class Received:
    """What a receiver accepted (payload, idempotency key), thread-safe."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, str | None]] = []
        self._lock = threading.Lock()

    def add(self, payload: Any, key: str | None) -> None:
        with self._lock:
            self.items.append((payload, key))


@contextlib.asynccontextmanager
async def aiohttp_receiver(verifier: WebhookVerifier, got: Received) -> AsyncIterator[str]:
    async def hook(request: web.Request) -> web.Response:
        payload = await aiohttp_payload(request, verifier)
        got.add(payload, request.headers.get("Idempotency-Key"))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def fastapi_receiver(verifier: WebhookVerifier, got: Received) -> Iterator[str]:
    import uvicorn
    from fastapi import Depends, FastAPI, Header

    app = FastAPI()
    verified = fastapi_dependency(verifier)

    # (annotations here are strings FastAPI resolves in this module's globals: no local names)
    @app.post("/hook")
    async def hook(
        payload: Any = Depends(verified),  # noqa: B008
        idempotency_key: str | None = Header(None),
    ) -> dict[str, bool]:
        got.add(payload, idempotency_key)
        return {"ok": True}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def flask_receiver(verifier: WebhookVerifier, got: Received) -> Iterator[str]:
    import flask
    from werkzeug.serving import make_server

    app = flask.Flask("receiver")

    @app.post("/hook")
    def hook() -> dict[str, bool]:
        got.add(flask_payload(verifier), flask.request.headers.get("Idempotency-Key"))
        return {"ok": True}

    server = make_server("127.0.0.1", free_port(), app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()  # make_server has bound and listens: requests queue until served
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook"
    finally:
        server.shutdown()
        thread.join(10)


@contextlib.asynccontextmanager
async def receiver(framework: str, verifier: WebhookVerifier, got: Received) -> AsyncIterator[str]:
    if framework == "aiohttp":
        async with aiohttp_receiver(verifier, got) as url:
            yield url
        return
    serve = fastapi_receiver if framework == "fastapi" else flask_receiver
    with serve(verifier, got) as url:
        yield url


FRAMEWORKS = ["aiohttp", "fastapi", "flask"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_signed_push_is_accepted_during_a_secret_rotation(
    db_url: str, framework: str
) -> None:
    got = Received()
    verifier = WebhookVerifier([CURRENT, OLD])  # the receiver knows both while rotating
    settings = make_settings(db_url, http={"signing_secret": OLD})
    async with (
        receiver(framework, verifier, got) as url,
        running_daemon(settings) as daemon,
        AsyncClient(daemon.base_url) as client,
    ):
        job = await client.enqueue("grant-1", "http", {"grant": 17}, target={"url": url})

        async def succeeded() -> bool:
            return (await client.get(job["id"]))["state"] == "succeeded"

        await wait_until(succeeded, what=f"the push accepted by {framework}")
    assert got.items == [({"grant": 17}, "grant-1")]


def forged(url_body: bytes, *, secret: str, stamp: int | None = None) -> dict[str, str]:
    return webhook_headers(secret, "msg_forged", stamp or int(time.time()), url_body)


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_pushes_not_signed_by_a_known_secret_are_refused_401(framework: str) -> None:
    got = Received()
    verifier = WebhookVerifier([CURRENT, OLD])
    body = json.dumps({"grant": 1}).encode()
    cases = {
        "unknown secret": (forged(body, secret=STRANGER), body),
        "tampered body": (forged(body, secret=CURRENT), b'{"grant": 2}'),
        "replayed late": (forged(body, secret=CURRENT, stamp=int(time.time()) - 3600), body),
        "unsigned": ({"webhook-id": "m", "webhook-timestamp": str(int(time.time()))}, body),
    }
    async with receiver(framework, verifier, got) as url, aiohttp.ClientSession() as http:
        for name, (headers, sent) in cases.items():
            async with http.post(url, data=sent, headers=headers) as response:
                assert response.status == 401, (name, response.status, await response.text())
        good = forged(body, secret=CURRENT)
        async with http.post(url, data=body, headers=good) as response:
            assert response.status == 200, await response.text()
    assert got.items == [({"grant": 1}, None)]


def test_the_verifier_says_which_check_failed() -> None:
    verifier = WebhookVerifier(CURRENT, tolerance_s=60)
    body = b'{"a": 1}'
    now = 1_800_000_000
    headers = webhook_headers(CURRENT, "msg_1", now, body)
    assert verifier.verify(headers, body, now=now + 59) == {"a": 1}
    assert verifier.verify({k.upper(): v for k, v in headers.items()}, body, now=now) == {"a": 1}
    with pytest.raises(InvalidSignature, match="61 s from this clock"):
        verifier.verify(headers, body, now=now + 61)
    with pytest.raises(InvalidSignature, match="no v1 signature matches"):
        verifier.verify(headers, b'{"a": 2}', now=now)
    with pytest.raises(InvalidSignature, match="missing webhook-id"):
        verifier.verify({}, body, now=now)
    with pytest.raises(InvalidSignature, match="not an integer"):
        verifier.verify({**headers, "webhook-timestamp": "soon"}, body, now=now)
    several = {**headers, "webhook-signature": "v2,abc v1,!!! " + headers["webhook-signature"]}
    assert verifier.verify(several, body, now=now) == {"a": 1}  # any one valid v1 entry
    with pytest.raises(ValueError, match="at least one"):
        WebhookVerifier([])
    assert asyncio.iscoroutinefunction(fastapi_dependency(verifier))
