"""The webhook signing secret (Standard Webhooks: `whsec_` and base64): decoded here, below the
configuration that checks it at load and the HTTP effect that signs with it."""

from __future__ import annotations

import base64
import binascii

SECRET_PREFIX = "whsec_"


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret; ValueError names the problem."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    # Secrets are often shared without base64 padding; restore it before decoding.
    encoded += "=" * (-len(encoded) % 4)
    try:
        key = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise ValueError("a signing secret is 'whsec_' followed by base64") from None
    if not key:
        raise ValueError("the signing secret is empty")
    return key
