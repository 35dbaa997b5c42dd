"""JSON encoding on the hot paths: job payloads and results sent to PostgreSQL, API responses.

orjson encodes several times faster than the standard library. It refuses some values the
standard library takes (integers beyond 64 bits, non-string keys); those take the standard
library's path instead of failing. Decoding stays with the standard library: orjson reads an
integer beyond 64 bits as a float, silently losing digits that jsonb kept exactly.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, sort_keys=sort_keys)
