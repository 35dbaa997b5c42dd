"""API bearer tokens: each has a name (what logs show, never the token) and scopes.

One entry per line of `api_tokens_file`, per item of `api_tokens`, or per `;`-separated part of
`DISPATCHER_API_TOKENS`:

    TOKEN [SCOPE,SCOPE,...] [# NAME]

Scopes are `read` (GET routes), `enqueue` (POST /v1/jobs and /v1/jobs/batch) and `operate`
(everything that changes a job, queue or schedule). A token without scopes has all three, as
every token had before scopes existed. Blank lines and lines starting with `#` are comments.
Errors name the entry (file line or list position) and never quote a token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

SCOPES = ("read", "enqueue", "operate")
MAX_NAME = 64
FORMAT = "TOKEN [SCOPE,SCOPE,...] [# NAME]"


class TokenError(ValueError):
    """A token entry that cannot be used; the message names where it is, never the token."""


@dataclass(frozen=True, slots=True)
class ApiToken:
    """One configured token. `digest` (SHA-256 of the token) is what requests are compared
    against: a fixed length, so the comparison's time says nothing about the token's length."""

    name: str
    scopes: frozenset[str]
    where: str
    secret: str = field(repr=False)
    digest: bytes = field(repr=False, default=b"")

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", digest(self.secret))

    def public_view(self) -> dict[str, object]:
        return {"name": self.name, "scopes": sorted(self.scopes), "from": self.where}


def digest(presented: bytes | str) -> bytes:
    data = presented.encode("utf-8", "surrogatepass") if isinstance(presented, str) else presented
    return hashlib.sha256(data).digest()


def parse_entry(text: str, where: str, default_name: str) -> ApiToken | None:
    """One entry, or None for a blank or comment line."""
    line = text.strip()
    if not line or line.startswith("#"):
        return None
    body, name = _split_name(line)
    fields = body.split()
    if len(fields) > 2:
        raise TokenError(
            f"{where}: expected {FORMAT}; scopes are separated by commas without spaces"
        )
    token = fields[0]
    if "," in token or ";" in token:
        raise TokenError(
            f"{where}: a token may not contain ',' or ';' (entries of DISPATCHER_API_TOKENS "
            f"with scopes are separated by ';'); expected {FORMAT}"
        )
    if token in SCOPES:
        raise TokenError(f"{where}: the token is a scope name; expected {FORMAT}")
    scopes = _scopes(fields[1], where) if len(fields) == 2 else frozenset(SCOPES)
    if name is None:
        name = default_name
    elif not name or len(name) > MAX_NAME or not name.isprintable():
        raise TokenError(
            f"{where}: the name after '#' must be 1 to {MAX_NAME} printable characters"
        )
    return ApiToken(name=name, scopes=scopes, where=where, secret=token)


def _split_name(line: str) -> tuple[str, str | None]:
    """`TOKEN scopes # name` -> ("TOKEN scopes", "name"); a '#' inside a token is kept."""
    for index, char in enumerate(line):
        if char == "#" and index > 0 and line[index - 1].isspace():
            return line[:index].rstrip(), line[index + 1 :].strip()
    return line, None


def _scopes(text: str, where: str) -> frozenset[str]:
    found = text.split(",")
    for position, scope in enumerate(found, 1):
        if scope not in SCOPES:
            # the word is not quoted: a token written where scopes go must not reach a log
            raise TokenError(
                f"{where}: scope {position} of {len(found)} is not one of {', '.join(SCOPES)}"
                " (commas between scopes, no spaces)"
            )
    return frozenset(found)


def parse_file(text: str, source: str) -> list[ApiToken]:
    """The entries of a tokens file; unnamed ones are called `<source> line N`."""
    tokens = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source} line {number}"
        entry = parse_entry(line, where, default_name=where)
        if entry is not None:
            tokens.append(entry)
    return tokens


def parse_list(items: Iterable[str], source: str) -> list[ApiToken]:
    """The entries of a list setting; unnamed ones are called `<source>[N]` (from 1)."""
    tokens = []
    for number, item in enumerate(items, 1):
        where = f"{source}[{number}]"
        entry = parse_entry(item, where, default_name=where)
        if entry is not None:
            tokens.append(entry)
    return tokens


def split_environment(value: str) -> list[str]:
    """The entries of DISPATCHER_API_TOKENS. Plain tokens are comma-separated, as always
    (`tok-a,tok-b`); once an entry has scopes or a name (a space in it), entries are separated
    by ';' or newlines instead, since commas then separate scopes (`tok-a read,enqueue;tok-b`)."""
    plain = [part.strip() for part in value.split(",")]
    if not any(len(part.split()) > 1 for part in plain):
        return [part for part in plain if part]
    return [entry.strip() for entry in value.replace("\n", ";").split(";") if entry.strip()]


def check_distinct(tokens: list[ApiToken]) -> None:
    """The same token twice would have two sets of scopes, the same name two tokens."""
    by_digest: dict[bytes, ApiToken] = {}
    by_name: dict[str, ApiToken] = {}
    for token in tokens:
        if (first := by_digest.setdefault(token.digest, token)) is not token:
            raise TokenError(f"{token.where}: the same token as {first.where}; keep one entry")
        if (first := by_name.setdefault(token.name, token)) is not token:
            raise TokenError(
                f"{token.where}: the name {token.name!r} is also used by {first.where}; "
                "names must be unique"
            )
