"""The fast JSON encoder gives what the standard library would, including where orjson refuses."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.core.jsoncodec import dumps, dumps_long_integers, loads

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_round_trips_exactly_like_the_standard_library(value: Any) -> None:
    assert json.loads(dumps(value)) == json.loads(json.dumps(value))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"n": 2**70}, '{"n": 1180591620717411303424}'),
        ({1: "a"}, '{"1": "a"}'),
    ],
)
def test_what_orjson_refuses_takes_the_standard_library_path(value: Any, text: str) -> None:
    assert dumps(value) == text


def test_a_float_keeps_every_digit() -> None:
    assert json.loads(dumps({"x": math.pi}))["x"] == math.pi


def test_sorted_keys_make_one_text_for_one_object() -> None:
    assert dumps({"b": 1, "a": {"d": 2, "c": 3}}, sort_keys=True) == dumps(
        {"a": {"c": 3, "d": 2}, "b": 1}, sort_keys=True
    )
    assert dumps({"b": 2**70, "a": 1}, sort_keys=True) == '{"a": 1, "b": 1180591620717411303424}'


@given(json_values, st.sampled_from(["", " ", "\n\t "]), st.sampled_from(["", " ", "\r\n"]))
def test_loads_reads_what_the_standard_library_reads(value: Any, before: str, after: str) -> None:
    for text in (before + json.dumps(value) + after, before + json.dumps(value, indent=1) + after):
        assert loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "  ", "{", '{"a": 1} {"b": 2}', "\ufeff{}", "nul", "1 2"])
def test_loads_refuses_what_the_standard_library_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        loads(text)


def test_loads_keeps_integers_beyond_64_bits_exact() -> None:
    assert loads('{"n": 123456789012345678901234567890}') == {"n": 123456789012345678901234567890}


def test_an_integer_past_pythons_digit_limit_is_read_exactly() -> None:
    """PostgreSQL writes 1e5000 as 5,001 digits, which json.loads refuses to read (its 4,300
    digit limit): such a row, stored before the doors refused it, is read whole, so it cannot
    fail the decoding of every row fetched with it."""
    text = '{"n": 1' + "0" * 5000 + ', "m": [2, -' + "9" * 4400 + "]}"
    with pytest.raises(ValueError, match="integer string conversion"):
        json.loads(text)
    value = loads(text)
    assert value["n"] == 10**5000
    assert value["m"][0] == 2 and value["m"][1] == -int(Decimal("9" * 4400))
    with pytest.raises(json.JSONDecodeError):  # anything else still fails as before
        loads('{"n": 1' + "0" * 5000 + ",}")


@given(json_values, st.booleans())
def test_the_long_integer_writer_writes_what_json_dumps_writes(value: Any, sort_keys: bool) -> None:
    for separators in ((", ", ": "), (",", ":")):
        assert dumps_long_integers(value, separators=separators, sort_keys=sort_keys) == json.dumps(
            value, separators=separators, sort_keys=sort_keys
        )


def test_an_integer_past_pythons_digit_limit_is_written_exactly() -> None:
    value = {"n": 10**5000, "m": [-(10**4400), "é"]}
    with pytest.raises(ValueError, match="integer string conversion"):
        json.dumps(value)
    text = dumps(value)
    assert text.startswith('{"n": 1' + "0" * 5000 + ", ")
    assert loads(text) == value
