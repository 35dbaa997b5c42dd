"""Forward-only schema migrations: numbered `.sql` files applied in order under an advisory lock."""

from __future__ import annotations

import logging
from importlib import resources

import asyncpg

from dispatcher.errors import SchemaMismatch

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same in every dispatcher process.
_MIGRATION_LOCK = 0x6469_7370


def available() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration shipped with this release, in order."""
    folder = resources.files("dispatcher.db").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text()))
    return sorted(found)


def latest_version() -> int:
    return available()[-1][0]


async def migrate(conn: asyncpg.Connection, upto: int | None = None) -> list[str]:
    """Apply pending migrations (those numbered up to `upto`, when given: tests of one
    migration start from the schema before it); return the names applied."""
    applied_now: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await conn.execute("CREATE SCHEMA IF NOT EXISTS dispatcher")
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS dispatcher.migrations (
                   version integer PRIMARY KEY, name text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM dispatcher.migrations")}
        for version, name, sql in available():
            if version in done or (upto is not None and version > upto):
                continue
            await conn.execute(sql)
            await conn.execute(
                "INSERT INTO dispatcher.migrations (version, name) VALUES ($1, $2)", version, name
            )
            applied_now.append(name)
    for name in applied_now:
        log.info("applied migration %s", name)
    return applied_now


async def current_version(conn: asyncpg.Connection) -> int | None:
    exists = await conn.fetchval("SELECT to_regclass('dispatcher.migrations') IS NOT NULL")
    if not exists:
        return None
    version: int | None = await conn.fetchval("SELECT max(version) FROM dispatcher.migrations")
    return version


async def check_current(conn: asyncpg.Connection) -> None:
    version = await current_version(conn)
    expected = latest_version()
    if version is None:
        raise SchemaMismatch(
            f"no dispatcher schema (this release needs version {expected}): if this is the "
            "right database, run `dispatcher migrate` (or `dispatcher run` with auto_migrate)"
        )
    if version < expected:
        raise SchemaMismatch(
            f"database schema is at version {version}, this release needs {expected}: "
            "run `dispatcher migrate` (or enable auto_migrate)"
        )
    if version > expected:
        raise SchemaMismatch(
            f"database schema is at version {version}, newer than this release knows "
            f"({expected}): run a dispatcher release at least as new as the one that migrated it"
        )
