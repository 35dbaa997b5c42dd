"""Receiving the daemon's HTTP pushes: verify their Standard Webhooks signature.

The daemon signs every push with `http.signing_secret` (https://www.standardwebhooks.com):
`webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`. A receiver checks it
against the exact body bytes and refuses a timestamp far from its clock (replay). Several
secrets may be given, so a secret can be rotated without a moment where pushes are refused:
give the receiver the new and the old one, switch the daemon, then drop the old one. While the
daemon itself rotates (`dispatcher signing-secret rotate`), each push carries one signature per
secret in use, and knowing any one of them is enough.

    verifier = WebhookVerifier(["whsec_new...", "whsec_old..."])
    payload = verifier.verify(headers, body)      # any framework; raises InvalidSignature

Framework helpers (each imports its framework only when called; install the one you use):
    aiohttp:            payload = await aiohttp_payload(request, verifier)
    FastAPI/Starlette:  payload = Depends(fastapi_dependency(verifier)),
                        or payload = await starlette_payload(request, verifier)
    Flask:              payload = flask_payload(verifier)
Each answers 401 with the reason when the signature does not hold. `payload` is the parsed JSON
the daemon pushed (the job's payload); the job's key is the `Idempotency-Key` header and the
delivery's id is `webhook-id` (the same on every attempt of a job: deduplicate on it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from dispatcher.config.signing_secret import decode_secret

DEFAULT_TOLERANCE_S = 300.0  # the Standard Webhooks reference libraries' window, both ways


class Headers(Protocol):
    """What every framework's header object offers (a dict, aiohttp's, Starlette's, Werkzeug's)."""

    def get(self, name: str, /) -> str | None: ...

    def items(self) -> Iterable[tuple[str, str]]: ...


class InvalidSignature(ValueError):
    """The push is not proven to come from the daemon; the message says which check failed."""


class WebhookVerifier:
    """Verifies pushes against one or more `whsec_` secrets (any one matching is enough)."""

    def __init__(self, secrets: Sequence[str], *, tolerance_s: float = DEFAULT_TOLERANCE_S):
        if isinstance(secrets, str):
            secrets = [secrets]
        if not secrets:
            raise ValueError("give at least one signing secret (whsec_...)")
        self._keys = [decode_secret(secret) for secret in secrets]
        self.tolerance_s = tolerance_s

    def verify(self, headers: Headers, body: bytes, now: float | None = None) -> Any:
        """The parsed JSON body when the signature holds, else InvalidSignature."""
        msg_id, stamp, signatures = (
            _header(headers, name)
            for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
        )
        if not (msg_id and stamp and signatures):
            raise InvalidSignature(
                "missing webhook-id, webhook-timestamp or webhook-signature header"
            )
        try:
            timestamp = int(stamp)
        except ValueError:
            raise InvalidSignature(f"webhook-timestamp {stamp!r} is not an integer") from None
        skew = abs((time.time() if now is None else now) - timestamp)
        if skew > self.tolerance_s:
            raise InvalidSignature(
                f"webhook-timestamp is {skew:.0f} s from this clock (tolerance "
                f"{self.tolerance_s:.0f} s): a replay, or a clock to fix"
            )
        signed = b"%s.%d.%s" % (msg_id.encode(), timestamp, body)
        expected = [hmac.new(key, signed, hashlib.sha256).digest() for key in self._keys]
        for entry in signatures.split():
            version, _, encoded = entry.partition(",")
            if version != "v1":
                continue
            try:
                given = base64.b64decode(encoded, validate=True)
            except ValueError:
                continue
            if any(hmac.compare_digest(given, mac) for mac in expected):
                return json.loads(body) if body else None
        raise InvalidSignature("no v1 signature matches any configured secret")


def _header(headers: Headers, name: str) -> str | None:
    value = headers.get(name)
    if value is None:  # a plain dict: the case may differ
        lowered = {k.lower(): v for k, v in headers.items()}
        value = lowered.get(name)
    return value


# aiohttp ---------------------------------------------------------------------------------------
async def aiohttp_payload(request: Any, verifier: WebhookVerifier) -> Any:
    """The verified payload of an aiohttp request, or `HTTPUnauthorized` (401) with the reason."""
    from aiohttp import web

    body = await request.read()
    try:
        return verifier.verify(request.headers, body)
    except InvalidSignature as exc:
        raise web.HTTPUnauthorized(text=str(exc)) from None


# Starlette and FastAPI -------------------------------------------------------------------------
async def starlette_payload(request: Any, verifier: WebhookVerifier) -> Any:
    """The verified payload of a Starlette (FastAPI) request, or HTTPException(401)."""
    from starlette.exceptions import HTTPException

    body = await request.body()
    try:
        return verifier.verify(request.headers, body)
    except InvalidSignature as exc:
        raise HTTPException(status_code=401, detail=str(exc)) from None


def fastapi_dependency(verifier: WebhookVerifier) -> Callable[..., Awaitable[Any]]:
    """A FastAPI dependency giving the verified payload: `payload = Depends(dependency)`."""
    from starlette.requests import Request

    async def verified_payload(request: Request) -> Any:
        return await starlette_payload(request, verifier)

    # FastAPI reads the parameter's type from the signature: give it the class itself, not the
    # string this module's `from __future__ import annotations` would leave there
    parameter = inspect.Parameter(
        "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request
    )
    verified_payload.__signature__ = inspect.Signature([parameter])  # type: ignore[attr-defined]
    return verified_payload


# Flask -----------------------------------------------------------------------------------------
def flask_payload(verifier: WebhookVerifier) -> Any:
    """The verified payload of the current Flask request, or abort(401) with the reason."""
    import flask

    body = flask.request.get_data(cache=True)
    try:
        return verifier.verify(flask.request.headers, body)
    except InvalidSignature as exc:
        flask.abort(401, description=str(exc))
