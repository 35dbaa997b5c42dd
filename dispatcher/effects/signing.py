"""Standard Webhooks signatures for the HTTP effect (https://www.standardwebhooks.com).

A receiver verifies `webhook-signature` against `webhook-id`, `webhook-timestamp` and the exact
body bytes with the shared secret, and rejects stale timestamps, which stops forgery and replay.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac

from dispatcher.config.signing_secret import decode_secret


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`."""
    return Signer(secret).signature(msg_id, timestamp, body)


class Signer:
    """`sign` with the secret decoded and the HMAC keyed once (the http effect signs every
    request): each signature copies the keyed HMAC, which spares the per-call key schedule and
    digest lookup of `hmac.new` (about 1 of 3 µs per small body, measured)."""

    __slots__ = ("_keyed",)

    def __init__(self, secret: str) -> None:
        self._keyed = hmac.new(decode_secret(secret), digestmod=hashlib.sha256)

    def signature(self, msg_id: str, timestamp: int, body: bytes) -> str:
        return self.signature_bytes(msg_id.encode(), timestamp, body).decode("ascii")

    def signature_bytes(self, msg_id: bytes, timestamp: int, body: bytes) -> bytes:
        """The `webhook-signature` value as bytes, ready for a request head."""
        mac = self._keyed.copy()
        mac.update(b"%s.%d.%s" % (msg_id, timestamp, body))
        return b"v1," + binascii.b2a_base64(mac.digest(), newline=False)


def webhook_headers(secret: str | None, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers; without a secret, id and timestamp only (no signature)."""
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    if secret is not None:
        headers["webhook-signature"] = sign(secret, msg_id, timestamp, body)
    return headers
