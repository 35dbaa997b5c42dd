"""The HTTP doors count a payload's bytes as jsonb's text without a database
(dispatcher.core.payload_size): the same count PostgreSQL gives, numbers written with an
exponent included (jsonb spells 1e-300 out in 302 bytes; counted as 6, a body of such numbers
had made a job forty times the limit)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.core import jsoncodec
from dispatcher.core.payload_size import oversize, rendered_bytes

VALUES: list[Any] = [
    {"x": 1e-300},
    {"x": [1e16, 1.5e-7, 0.1, 123.456, -2.5e-10, 1e300, 5e-324, -0.0, 0.0]},
    {"a": {"b": [1, "1e5", 2.5e-5, None, True]}, "c": 10**30},
    {"text": "é ünïcode \\u0001 \u2028", "n": 7},
]


async def pg_bytes(conn: asyncpg.Connection, value: Any) -> int:
    n: int = await conn.fetchval("SELECT octet_length($1::jsonb::text)", jsoncodec.dumps(value))
    return n


@pytest.mark.parametrize("value", VALUES, ids=["tiny", "floats", "nested", "text"])
async def test_the_count_is_postgresqls(conn: asyncpg.Connection, value: Any) -> None:
    assert rendered_bytes(value, None) == await pg_bytes(conn, value)


floats = st.floats(allow_nan=False, allow_infinity=False)


def text(size: int) -> st.SearchStrategy[str]:
    """Text jsonb stores (no NUL, no lone surrogate: PostgreSQL's text has neither; the doors
    refuse both)."""
    return st.text(
        st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=size
    )


values = st.recursive(
    st.none() | st.booleans() | st.integers() | floats | text(8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text(4), inner),
    max_leaves=12,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values)
async def test_any_value_counts_as_postgresql_renders_it(
    conn: asyncpg.Connection, value: Any
) -> None:
    assert rendered_bytes({"v": value}, None) == await pg_bytes(conn, {"v": value})


def test_a_value_the_doors_refuse_is_counted_without_an_error() -> None:
    # a lone surrogate with an integer past 64 bits (the standard library's path): counted
    assert rendered_bytes({"s": "\ud800", "n": 2**70}, None) > 0


def test_a_body_of_spelled_out_numbers_is_over_the_limit() -> None:
    # 20 x 1e-300: 140 bytes compact, 6,087 as jsonb's text
    assert oversize({"x": [1e-300] * 20}, None, 4096) == 6087
    assert oversize({"x": [1e-300] * 10}, None, 4096) is None
