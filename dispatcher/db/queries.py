"""Named SQL statements, parsed once from the `.sql` files beside this module.

Each block starts with `-- name: x`, then one comment line saying what it is for, then the SQL.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_BLOCK = re.compile(r"^-- name: (\w+)\n((?:--[^\n]*\n)*)(.*?)(?=^-- name: |\Z)", re.M | re.S)


@cache
def all_queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in sorted(resources.files("dispatcher.db").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for match in _BLOCK.finditer(entry.read_text()):
            name = match.group(1)
            if name in found:
                raise RuntimeError(f"query {name!r} is defined twice ({entry.name})")
            found[name] = match.group(3).strip().rstrip(";")
    return found


def query(name: str) -> str:
    return all_queries()[name]
