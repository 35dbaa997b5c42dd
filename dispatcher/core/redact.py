"""What an operator sees of a target (the console's job page, a job's callback targets in the
API and the CLI): where it goes, never what authenticates it.

Header values (Authorization, API keys, cookies: any header may carry a secret), the password
of a URL's user information and the values of its query string are replaced by a mask; names
stay, so an operator sees which headers and parameters were sent.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

MASK = "•••"


def masked_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return MASK  # not a URL we can take apart: show nothing of it
    netloc = host if ":" not in host else f"[{host}]"
    if port is not None:
        netloc = f"{netloc}:{port}"
    if parts.username is not None:
        user = parts.username + (f":{MASK}" if parts.password is not None else "")
        netloc = f"{user}@{netloc}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{quote(name, safe='')}={MASK}" for name, _ in pairs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


# Every field the job page shows, present whichever door stored the target: the HTTP API
# stores it normalised (method, headers, timeout), the SQL door and direct inserts as given, so
# `{"url": ...}` alone (the README's own example) made the page answer 500 (issue 20).
SHOWN_TARGET_DEFAULTS: dict[str, Any] = {
    "url": "",
    "method": "POST",
    "headers": {},
    "timeout_s": None,
}


def masked_target(target: Any, url: str | None = None) -> dict[str, Any] | None:
    """A copy of a stored http target with its secrets masked, with every field of
    `SHOWN_TARGET_DEFAULTS` (None if there is no target). `url`: the target's URL, for a target
    too large to load (None: the target itself is given)."""
    if not isinstance(target, dict):
        target = {"url": url} if isinstance(url, str) else None
        if target is None:
            return None
    shown: dict[str, Any] = dict(SHOWN_TARGET_DEFAULTS)
    for field, value in target.items():
        if field == "url":
            shown["url"] = masked_url(value) if isinstance(value, str) else MASK
        elif field == "headers" and isinstance(value, dict):
            shown["headers"] = {str(name): MASK for name in value}
        elif field in ("method", "timeout_s") and value is not None:
            shown[field] = value if isinstance(value, str | int | float) else str(value)
        elif field not in SHOWN_TARGET_DEFAULTS:
            shown[field] = MASK  # a field added later may hold a secret too: mask by default
    return shown
