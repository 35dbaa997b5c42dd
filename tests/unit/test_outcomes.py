"""The safe forms of outcomes (dispatcher/db/outcomes.py), as docs/outcomes.md tabulates them:
each kind of value's form, and for any value at all: JSON that PostgreSQL stores (no NUL, valid
UTF-8, bounded), unchanged when storable as given, and the same text by the fast path as by
the walk."""

from __future__ import annotations

import datetime
import enum
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core import jsoncodec
from dispatcher.db.outcomes import (
    MAX_DEPTH,
    MAX_RESULT_CHARS,
    MAX_TEXT_CHARS,
    REPR_CHARS,
    result_json,
    storable_result,
    storable_text,
)
from dispatcher.effects.base import Delivered


class Colour(enum.StrEnum):
    RED = "red"


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


def cyclic() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


FORMS: list[tuple[str, Any, Any]] = [
    ("NUL in text", "a\x00b", "a\\u0000b"),
    ("a lone surrogate", "x\ud800", "x\\ud800"),
    ("NUL in a key", {"k\x00": 1}, {"k\\u0000": 1}),
    ("NaN", float("nan"), "NaN"),
    ("infinities", [float("inf"), float("-inf")], ["Infinity", "-Infinity"]),
    ("an int within 4,300 digits", 10**4299, 10**4299),
    (
        "an int past 4,300 digits",
        -(10**5000) - 7,
        "-1000000000…0000000007 (an integer of 5001 digits, stored as text)",
    ),
    ("a set", {"tags": {3}}, {"tags": "{3}"}),
    ("bytes", b"\x00\xff", "b'\\x00\\xff'"),
    ("an object", Opaque(), "<Opaque>"),
    ("keys json.dumps writes", {2: "a", None: "b", False: "c", 1.5: "d"}, None),
    ("a tuple key", {(1, 2): 0}, {"(1, 2)": 0}),
    ("a cycle", cyclic(), [1, "[cycle: this list contains itself]"]),
    ("a tuple", (1, "x"), [1, "x"]),
    ("a str enum", Colour.RED, "red"),
    ("a datetime", datetime.datetime(2031, 5, 31, 2, tzinfo=datetime.UTC), None),
    ("the http summary", Delivered({"status": 200}, http_status=200, excerpt="x"), None),
]


@pytest.mark.parametrize(("value", "expected"), [f[1:] for f in FORMS], ids=[f[0] for f in FORMS])
def test_each_kind_of_value_has_its_documented_form(value: Any, expected: Any) -> None:
    if expected is None:  # what orjson writes for it
        expected = {
            dict: lambda v: {"2": "a", "null": "b", "false": "c", "1.5": "d"},
            datetime.datetime: lambda v: "2031-05-31T02:00:00+00:00",
            Delivered: lambda v: {"status": 200},
        }[type(value)](value)
    assert storable_result(value) == expected


def test_text_past_its_limit_is_cut_with_a_marker_saying_how_long_it_was() -> None:
    assert storable_text("x" * 2500, 2000) == "x" * 2000 + "… [cut: 2500 characters in all]"
    assert storable_text("\x00" * 10, 12) == "\\u0000\\u0000… [cut: 60 characters in all]"
    assert storable_text(None, 10) is None
    text = "short and plain"
    assert storable_text(text, 100) is text  # unchanged: the same object


def test_too_deep_too_large_and_unreadable_values_become_bounded_excerpts() -> None:
    deep = storable_result(nested(MAX_DEPTH + 10))
    for _ in range(MAX_DEPTH):
        [deep] = deep
    assert deep.startswith(f"[nested deeper than {MAX_DEPTH} levels] ")
    large = storable_result(list(range(1_000_000)))
    assert large.startswith(f"[result too large to store: over {MAX_RESULT_CHARS} characters")
    assert len(large) < 2 * REPR_CHARS
    assert storable_result("y" * 100_000) == "y" * MAX_TEXT_CHARS + (
        "… [cut: 100000 characters in all]"
    )

    class NoRepr:
        def __repr__(self) -> str:
            raise RuntimeError

    assert storable_result(NoRepr()).startswith("<NoRepr instance at 0x")  # reprlib's own
    assert storable_result(b"\x00" * 10**6).endswith("…")


anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([4300, 4301, 9000]).map(lambda digits: 7 * 10 ** (digits - 1))
    | st.floats()
    | st.text(st.characters(exclude_categories=()))
    | st.binary(max_size=20)
    | st.frozensets(st.integers(), max_size=3).map(set)
    | st.builds(Opaque),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner)
        | st.dictionaries(st.text(st.characters(exclude_categories=())) | st.integers(), inner)
    ),
    max_leaves=20,
)
plain = st.recursive(  # JSON every database stores as given
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")), inner
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=anything | st.integers(0, 3 * MAX_DEPTH).map(nested))
def test_any_value_becomes_json_postgresql_stores(value: Any) -> None:
    text = result_json(value)
    if value is None:
        assert text is None
        return
    assert text is not None
    text.encode("utf-8")  # no lone surrogate survives
    assert "\\u0000" not in text.replace("\\\\", "")  # no NUL escape for jsonb to refuse
    assert len(text) <= 6 * MAX_RESULT_CHARS  # bounded (escapes take six characters for one)
    assert json.loads(text, parse_constant=pytest.fail) == json.loads(
        jsoncodec.dumps(storable_result(value))  # the fast path agrees with the walk
    )


@settings(max_examples=200, deadline=None)
@given(value=plain)
def test_a_value_storable_as_given_is_kept_as_it_is(value: Any) -> None:
    assert storable_result(value) is value
    assert json.loads(result_json(value) or "null") == value
