"""The size a job's payload and target count against `limits.max_payload_bytes`: the bytes of
their JSON text in UTF-8 as PostgreSQL renders jsonb (`octet_length(payload::text)`), which is
what the SQL door measures and what a claim later receives. The HTTP door measures the parsed
values the same way without a database: the compact encoding plus one space after each `:` and
`,` of the structure (jsonb's rendering), and each number written with an exponent counted as
jsonb spells it out (1e-300 is 302 bytes of text: not counted, a body of such numbers became a
job 40 times the limit)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import orjson

# a number written with an exponent (orjson writes 1e-300 and 1e+16 so), or -0.0 (jsonb: 0.0);
# may match inside a string too, which costs only the walk that finds none
_SPELLED_OTHERWISE = re.compile(rb"[0-9][eE][-+]?[0-9]|-0\.0(?![0-9])")


def oversize(payload: Any, target: Any, limit: int) -> int | None:
    """The rendered size of `payload` and `target` when it exceeds `limit`, else None."""
    compact = _compact_bytes(payload, target)
    # the rendering adds at most one byte per byte of the compact text (a space after each
    # separator): a job whose compact text is within half the limit needs no counting
    if compact * 2 <= limit:
        return None
    size = compact + _separators(payload) + (0 if target is None else _separators(target))
    return size if size > limit else None


def rendered_bytes(payload: Any, target: Any) -> int:
    """The bytes of `payload` and `target` as jsonb's text, counted without a database."""
    separators = _separators(payload) + (0 if target is None else _separators(target))
    return _compact_bytes(payload, target) + separators


def _compact_bytes(payload: Any, target: Any) -> int:
    """The compact text's bytes, each number written with an exponent counted spelled out."""
    size = 0
    for value in (payload,) if target is None else (payload, target):
        text, write = _compact(value)
        size += len(text)
        if _SPELLED_OTHERWISE.search(text):
            size += _spelled_out(value, write)
    return size


def _orjson_float(value: float) -> str:
    return orjson.dumps(value).decode()


def _compact(value: Any) -> tuple[bytes, Callable[[float], str]]:
    """The compact text, and how it writes a float."""
    try:
        return orjson.dumps(value), _orjson_float
    except TypeError:  # integers beyond 64 bits: the standard library's path, as compact
        # (a lone surrogate, refused before the count by the doors, is counted, not raised)
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8", "surrogatepass"), repr


def _spelled_out(value: Any, write: Callable[[float], str]) -> int:
    """The bytes jsonb's text adds to the compact one (whose floats `write` wrote) by writing
    each float out in full, as numeric does (1e-300: 0.000...1, 302 bytes for 6)."""
    extra = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            written = write(item)
            if "e" in written or "E" in written:
                extra += len(format(Decimal(written), "f")) - len(written)
            elif item == 0 and written.startswith("-"):  # numeric has no negative zero
                extra -= 1
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return extra


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
