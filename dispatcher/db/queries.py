"""Named SQL statements, parsed once from `queries.sql` (`-- name: x` starts each block)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_BLOCK = re.compile(r"^-- name: (\w+)\n((?:--[^\n]*\n)*)(.*?)(?=^-- name: |\Z)", re.M | re.S)


@cache
def all_queries() -> dict[str, str]:
    text = resources.files("dispatcher.db").joinpath("queries.sql").read_text()
    return {m.group(1): m.group(3).strip().rstrip(";") for m in _BLOCK.finditer(text)}


def query(name: str) -> str:
    return all_queries()[name]
