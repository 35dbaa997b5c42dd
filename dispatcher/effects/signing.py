"""Standard Webhooks signatures for the HTTP effect (https://www.standardwebhooks.com).

A receiver verifies `webhook-signature` against `webhook-id`, `webhook-timestamp` and the exact
body bytes with the shared secret, and rejects stale timestamps, which stops forgery and replay.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from dispatcher.signing_secret import decode_secret


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`."""
    return Signer(secret).signature(msg_id, timestamp, body)


class Signer:
    """`sign` with the secret decoded once (the http effect signs every request)."""

    __slots__ = ("_key",)

    def __init__(self, secret: str) -> None:
        self._key = decode_secret(secret)

    def signature(self, msg_id: str, timestamp: int, body: bytes) -> str:
        signed = b".".join((msg_id.encode(), str(timestamp).encode(), body))
        digest = hmac.new(self._key, signed, hashlib.sha256).digest()
        return "v1," + base64.b64encode(digest).decode("ascii")


def webhook_headers(secret: str | None, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers; without a secret, id and timestamp only (no signature)."""
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    if secret is not None:
        headers["webhook-signature"] = sign(secret, msg_id, timestamp, body)
    return headers
