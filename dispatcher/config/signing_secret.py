"""The webhook signing secrets (Standard Webhooks: `whsec_` and base64): decoded and read here,
below the configuration that checks them at load and the HTTP effect that signs with them.

Several secrets may be in use at once, so that one can be rotated without a moment where
receivers refuse pushes: every push carries one signature per secret in use
(`webhook-signature: v1,<sig> v1,<sig>`), and a receiver accepts any one it can verify. The
secret file (`http.signing_secret_file`) holds one secret per line:

    whsec_<base64>                                  # the primary: first, without an end
    whsec_<base64> not-after=2026-12-09T13:00:00Z   # an older one, used until then

The first line is the primary and never ends; each later line may carry `not-after=<RFC 3339
time>`, after which it is no longer used (by the daemon's clock, whether or not it was
reloaded), so an overlap holds across restarts. `dispatcher signing-secret rotate` writes a new
primary and keeps the old one until the end of the overlap. Blank lines and text after `#` are
comments. Errors name the line and never quote a secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dispatcher.core import rfc3339

SECRET_PREFIX = "whsec_"
FORMAT = "whsec_<base64> [not-after=<RFC 3339 time>]"
NOT_AFTER = "not-after="
NEW_SECRET_BYTES = 32


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


def new_secret() -> str:
    """A fresh random secret, 32 bytes as Standard Webhooks suggests."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(NEW_SECRET_BYTES)).decode()


@dataclass(frozen=True, slots=True)
class SigningSecret:
    """One secret in use; `not_after` None: no end (the primary). `line` says where it was
    read, for messages; the secret itself never appears in a repr or a message."""

    secret: str = field(repr=False)
    not_after: datetime | None = None
    line: int = 0

    @property
    def fingerprint(self) -> str:
        """What logs and commands show instead of the secret: a short hash of its key."""
        return "sha256:" + hashlib.sha256(decode_secret(self.secret)).hexdigest()[:12]

    def in_use(self, now: datetime) -> bool:
        return self.not_after is None or now <= self.not_after

    def describe(self) -> str:
        end = f" until {rfc3339.format(self.not_after)}" if self.not_after else ""
        return self.fingerprint + end


def parse_secrets(text: str, where: str, unit: str = "line") -> list[SigningSecret]:
    """Every secret of `text` (one per line, the file's format), the primary first; ValueError
    naming `where` and the line (or entry) when one cannot be used."""
    found: list[SigningSecret] = []
    seen: dict[bytes, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        place = f"{where} {unit} {number}"
        try:
            key = decode_secret(fields[0])
        except ValueError as exc:
            raise ValueError(f"{place}: {exc}; expected {FORMAT}") from None
        if key in seen:
            raise ValueError(f"{place}: the same secret as {unit} {seen[key]}; remove one")
        seen[key] = number
        entry = SigningSecret(fields[0], _not_after(fields[1:], place), number)
        if not found and entry.not_after is not None:
            raise ValueError(
                f"{place}: the primary secret (the first) cannot end, or pushes would go "
                "unsigned after it: put the new secret first without not-after "
                "(`dispatcher signing-secret rotate` does)"
            )
        found.append(entry)
    if not found:
        raise ValueError(f"{where}: no secret; expected a {unit} {FORMAT}")
    return found


def _not_after(extra: list[str], place: str) -> datetime | None:
    if not extra:
        return None
    if len(extra) > 1 or not extra[0].startswith(NOT_AFTER):
        # never quoted: a second field may be a secret pasted on the wrong line
        raise ValueError(
            f"{place}: unexpected text after the secret (a secret is 'whsec_' followed by "
            f"base64, without spaces); expected {FORMAT}"
        )
    try:
        return rfc3339.utc(rfc3339.parse(extra[0].removeprefix(NOT_AFTER)))
    except rfc3339.TimeError as exc:
        raise ValueError(f"{place}: not-after {exc}") from None


def rotated(
    current: Sequence[SigningSecret], primary: str, now: datetime, overlap_s: float
) -> list[SigningSecret]:
    """The secrets after a rotation: `primary` first, the old primary until now + overlap_s
    (dropped with an overlap of 0), then the older ones still in use; ended ones are dropped."""
    ends = now + timedelta(seconds=overlap_s)
    kept = [SigningSecret(primary)]
    for entry in current:
        if entry.not_after is None and overlap_s > 0:
            kept.append(SigningSecret(entry.secret, ends))
        elif entry.not_after is not None and entry.in_use(now):
            kept.append(SigningSecret(entry.secret, min(entry.not_after, ends)))
    return kept


def format_secrets(entries: Sequence[SigningSecret]) -> str:
    """The file's text for `entries` (parse_secrets reads it back)."""
    lines = [
        "# webhook signing secrets: the first signs as primary; each other one until its",
        "# not-after (dispatcher signing-secret rotate writes this file)",
    ]
    for entry in entries:
        end = f" {NOT_AFTER}{rfc3339.format(entry.not_after)}" if entry.not_after else ""
        lines.append(entry.secret + end)
    return "\n".join(lines) + "\n"
