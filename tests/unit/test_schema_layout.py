"""Each function, view and trigger body is written once, in db/functions/ (docs/architecture.md,
"Schema: migrations and function files"). A body restated in a migration would run before the
function files and be replaced by them at the end of the same migrate: the change would be lost
without a word, so this fails first, naming the file to move it to."""

from __future__ import annotations

import re
from collections import defaultdict

from dispatcher.db import schema

CREATES = re.compile(
    r"^CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|VIEW|TRIGGER)\s+(?:dispatcher\.)?(\w+)",
    re.IGNORECASE | re.MULTILINE,
)
# Part of a table's definition (a CHECK constraint uses it): created and changed by migrations.
CONSTRAINT_FUNCTIONS = {"due_at_range"}


def test_migrations_hold_no_function_view_or_trigger_body() -> None:
    found = [
        f"{name} creates the {kind.lower()} dispatcher.{obj}"
        for _, name, sql in schema.available()
        for _, kind, obj in CREATES.findall(sql)
        if obj not in CONSTRAINT_FUNCTIONS
    ]
    assert not found, (
        "; ".join(found) + ": put the body in its file of dispatcher/db/functions/ (CREATE OR "
        "REPLACE; a signature change drops the old one in the migration), then regenerate "
        "dispatcher/db/schema.sql (docs/testing.md, Changing the schema)"
    )


def test_every_body_is_in_one_function_file_and_replaceable() -> None:
    where: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    for name, sql, _ in schema.function_files():
        assert re.fullmatch(r"[1-3]0_\w+\.sql", name), f"{name}: name it TT_object.sql (10, 20, 30)"
        for replace, kind, obj in CREATES.findall(sql):
            assert replace, f"{name}: CREATE {kind} {obj} without OR REPLACE fails the next migrate"
            where[(kind.upper(), obj)].add(name)  # overloads share their one file
    twice = [f"{kind} {obj}" for (kind, obj), files in where.items() if len(files) > 1]
    assert not twice, f"defined in more than one function file: {twice}"
    assert where, "no function files found"
