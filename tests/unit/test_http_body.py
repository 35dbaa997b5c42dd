"""The http effect's request body is exactly `json.dumps(payload, separators=(",", ":"))`,
the bytes receivers have always been sent and verified signatures over."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.effects.http import _encode


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"n": 1},
        {"order": 42, "items": ["a", "b"], "note": "café", "line": "a\u2028b\nc\t\x00\x7f"},
        {"floats": [0.1, 1e16, 1e-05, -0.0, 123456789.125], "big": 2**70, "neg": -(2**65)},
        {"nested": {"deep": [{"x": None, "t": True, "f": False}, [], {}]}, "emoji": "\U0001f600"},
        ["a", 1, 2.5, None],
        'just a string with "quotes" and \\',
        12345,
    ],
)
def test_body_bytes_equal_json_dumps_compact(payload: Any) -> None:
    assert _encode(payload) == json.dumps(payload, separators=(",", ":")).encode()
