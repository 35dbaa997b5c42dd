"""The size a job's payload and target count against `limits.max_payload_bytes`: the bytes of
their JSON text in UTF-8 as PostgreSQL renders jsonb (`octet_length(payload::text)`), which is
what the SQL door measures and what a claim later receives. The HTTP door measures the parsed
values the same way without a database: the compact encoding plus one space after each `:` and
`,` of the structure (jsonb's rendering). Numbers written with an exponent may count a few bytes
differently (jsonb spells them out); nothing else does."""

from __future__ import annotations

from typing import Any

import orjson

from dispatcher.core import jsoncodec


def oversize(payload: Any, target: Any, limit: int) -> int | None:
    """The rendered size of `payload` and `target` when it exceeds `limit`, else None."""
    compact = _compact_bytes(payload) + (0 if target is None else _compact_bytes(target))
    # the rendering adds at most one byte per byte of the compact text (a space after each
    # separator): a job whose compact text is within half the limit needs no counting
    if compact * 2 <= limit:
        return None
    size = compact + _separators(payload) + (0 if target is None else _separators(target))
    return size if size > limit else None


def _compact_bytes(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # integers beyond 64 bits: the standard library's path
        return len(jsoncodec.dumps(value).encode())


def _separators(value: Any) -> int:
    """The `:` and `,` of the structure (not inside strings): jsonb puts a space after each."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += 2 * len(item) - 1 if item else 0
            stack.extend(item.values())
        elif isinstance(item, list):
            count += len(item) - 1 if item else 0
            stack.extend(item)
    return count
