"""The schema's two parts: numbered migrations and the function files (db/functions/).

Every path to the current release ends with the same schema (compared from the catalogs:
columns, constraints, indexes, pg_get_functiondef, pg_get_viewdef, pg_get_triggerdef), the
committed db/schema.sql is that schema, the function files are tracked by content hash, and a
release older than the database refuses before it changes anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from dispatcher import __version__
from dispatcher.db import schema
from dispatcher.db.snapshot import COMMAND, SNAPSHOT, render
from dispatcher.errors import SchemaMismatch


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(db_url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def fresh_schema(conn: asyncpg.Connection) -> str:
    """The schema a fresh migrate of this release leaves (db_url is one)."""
    return await render(conn)


async def test_the_committed_snapshot_is_a_fresh_migrate(fresh_schema: str) -> None:
    assert fresh_schema == SNAPSHOT.read_text(), (
        f"dispatcher/db/schema.sql is not what a fresh migrate gives: run `{COMMAND} "
        "postgresql://...` and commit it"
    )


async def test_migrating_one_step_at_a_time_ends_with_the_fresh_schema(
    empty_db_url: str, fresh_schema: str
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        for version, name, _ in schema.available():
            applied = await schema.migrate(conn, upto=version)
            assert applied[0] == name
            # the function files wait for the last migration's tables
            assert [n for n in applied if n.startswith("functions/")] == (
                [] if version < schema.latest_version() else applied[1:]
            )
        assert await render(conn) == fresh_schema
    finally:
        await conn.close()


async def test_a_database_of_the_release_before_function_files_gets_them(
    conn: asyncpg.Connection, fresh_schema: str
) -> None:
    """That release left every body in place (from its migrations) and no hash record."""
    await conn.execute("DROP TABLE dispatcher.function_files")
    with pytest.raises(SchemaMismatch, match=r"function files.*run `dispatcher migrate`"):
        await schema.check_current(conn)
    applied = await schema.migrate(conn)
    assert applied == [f"functions/{name}" for name, _, _ in schema.function_files()]
    assert await render(conn) == fresh_schema
    await schema.check_current(conn)


async def test_a_function_changed_in_the_database_is_put_back_by_migrate(
    conn: asyncpg.Connection,
) -> None:
    """The hash record says which files the database holds: one marked stale (as after an
    edit of the file) is applied again, the others are left alone."""
    await conn.execute(
        """CREATE OR REPLACE FUNCTION dispatcher.liveness_namespace() RETURNS integer
           LANGUAGE sql IMMUTABLE AS $$ SELECT 7 $$;
           UPDATE dispatcher.function_files SET sha256 = 'stale' WHERE name = '10_liveness.sql'"""
    )
    with pytest.raises(SchemaMismatch, match=r"differ .*10_liveness.sql.*dispatcher migrate"):
        await schema.check_current(conn)
    assert await schema.migrate(conn) == ["functions/10_liveness.sql"]
    assert await conn.fetchval("SELECT dispatcher.liveness_namespace()") == 1684632436
    assert await schema.migrate(conn) == []
    await schema.check_current(conn)


async def test_an_edited_function_file_is_applied_and_recorded(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = list(schema.function_files())
    at = next(i for i, (name, _, _) in enumerate(files) if name == "10_liveness.sql")
    name, sql, _ = files[at]
    edited = sql.replace("SELECT 1684632436", "SELECT 42")
    assert edited != sql
    files[at] = (name, edited, "edited-digest")
    monkeypatch.setattr(schema, "function_files", lambda: tuple(files))

    assert await schema.migrate(conn) == ["functions/10_liveness.sql"]
    assert await conn.fetchval("SELECT dispatcher.liveness_namespace()") == 42
    row = await conn.fetchrow(
        "SELECT sha256, release FROM dispatcher.function_files WHERE name = $1", name
    )
    assert tuple(row) == ("edited-digest", __version__)


async def test_what_a_migration_dropped_the_function_files_create_again(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch, fresh_schema: str
) -> None:
    """A migration changing a view's columns drops it, and its trigger with it; no file's text
    changed, so the hashes alone would not bring them back: after a migration, all files are
    applied."""
    shipped = schema.available()
    later = (schema.latest_version() + 1, "later_view_change.sql", "DROP VIEW dispatcher.jobs;")
    monkeypatch.setattr(schema, "available", lambda: [*shipped, later])
    applied = await schema.migrate(conn)
    assert applied == ["later_view_change.sql"] + [
        f"functions/{name}" for name, _, _ in schema.function_files()
    ]
    assert await render(conn) == fresh_schema
    assert await schema.migrate(conn) == []


async def test_a_release_older_than_the_schema_refuses_and_changes_nothing(
    conn: asyncpg.Connection,
) -> None:
    """A newer release migrated the database: this one must not put its own (older) bodies
    back, nor run on a schema it does not know."""
    newer = schema.latest_version() + 1
    await conn.execute(
        "INSERT INTO dispatcher.migrations (version, name) VALUES ($1, 'from a newer release')",
        newer,
    )
    await conn.execute(
        "UPDATE dispatcher.function_files SET sha256 = 'newer' WHERE name = '10_enqueue.sql'"
    )
    expected = (
        f"database schema is at version {newer}, newer than this release knows "
        f"\\({schema.latest_version()}, dispatcher {__version__}\\): run a dispatcher release "
        "at least as new"
    )
    with pytest.raises(SchemaMismatch, match=expected + ".*nothing was changed"):
        await schema.migrate(conn)
    with pytest.raises(SchemaMismatch, match=expected):
        await schema.check_current(conn)
    assert (
        await conn.fetchval(
            "SELECT sha256 FROM dispatcher.function_files WHERE name = '10_enqueue.sql'"
        )
        == "newer"
    )


async def test_functions_written_by_a_newer_release_are_not_replaced(
    conn: asyncpg.Connection,
) -> None:
    """Same migrations, other bodies: a release that changed only function files. An older
    daemon starting with auto_migrate would otherwise undo the newer release's fix."""
    await conn.execute(
        """UPDATE dispatcher.function_files SET sha256 = 'newer', release = '999.1'
            WHERE name = '10_enqueue.sql'"""
    )
    expected = (
        f"SQL functions were written by dispatcher 999.1, newer than this release "
        f"\\({__version__}; 1 of its function files differ, e.g. 10_enqueue.sql\\): "
        "run dispatcher 999.1 or newer"
    )
    with pytest.raises(SchemaMismatch, match=expected + "; nothing was changed"):
        await schema.migrate(conn)
    with pytest.raises(SchemaMismatch, match=expected):
        await schema.check_current(conn)
    assert (
        await conn.fetchval(
            "SELECT sha256 FROM dispatcher.function_files WHERE name = '10_enqueue.sql'"
        )
        == "newer"
    )
    # an older release's record is no reason to refuse: this one brings its own files
    await conn.execute("UPDATE dispatcher.function_files SET release = '0.0.1'")
    assert await schema.migrate(conn) == ["functions/10_enqueue.sql"]
