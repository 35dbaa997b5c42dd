"""The dispatcher schema's indexes as the catalog holds them, for the tests of migrations that
must keep indexes an operator built beforehand with CREATE INDEX CONCURRENTLY."""

from __future__ import annotations

import asyncpg

from dispatcher.db import schema


async def index_states(conn: asyncpg.Connection) -> dict[str, tuple[int, bool]]:
    """Every index of the dispatcher schema: name -> (oid, valid). A kept index keeps its oid."""
    rows = await conn.fetch(
        """SELECT c.relname, c.oid, i.indisvalid
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE c.relnamespace = 'dispatcher'::regnamespace""",
    )
    return {r["relname"]: (r["oid"], r["indisvalid"]) for r in rows}


async def fail_half_way(conn: asyncpg.Connection, index: str) -> None:
    """What a concurrent build that failed half-way leaves behind: the index, marked invalid."""
    await conn.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = $1::regclass",
        f"dispatcher.{index}",
    )


async def upgrade_after_the_guides_block(
    conn: asyncpg.Connection, migration: str, statements: list[str], broken: str | None
) -> tuple[dict[str, tuple[int, bool]], dict[str, tuple[int, bool]]]:
    """Migrate to just before `migration` (its file name), run the guide's `statements` one at a
    time (outside any transaction), leave index `broken` (if any) as a failed concurrent build
    does, then apply `migration` alone: the indexes before and after."""
    version = int(migration.split("_", 1)[0])
    await schema.migrate(conn, upto=version - 1)
    for statement in statements:
        await conn.execute(statement)
    if broken is not None:
        await fail_half_way(conn, broken)
    before = await index_states(conn)
    applied = await schema.migrate(conn, upto=version)
    assert [name for name in applied if not name.startswith("functions/")] == [migration]
    return before, await index_states(conn)


async def check_moved_indexes(
    db_url: str, statements: list[str], migration: str, kept: str, rebuilt: str, dropped: list[str]
) -> None:
    """A migration that replaces `dropped` with new indexes, on a table whose operator built the
    new ones beforehand with the guide's `statements`, `rebuilt` left invalid by a failed
    build: `kept` is kept (built nothing twice), `rebuilt` built again, every new one valid and
    every old one gone."""
    conn = await asyncpg.connect(db_url)
    try:
        before, after = await upgrade_after_the_guides_block(conn, migration, statements, rebuilt)
    finally:
        await conn.close()
    assert all(name in before for name in dropped)
    assert all(after[name][1] for name in (kept, rebuilt)), after
    assert after[kept][0] == before[kept][0]
    assert after[rebuilt][0] != before[rebuilt][0]
    assert not any(name in after for name in dropped)
