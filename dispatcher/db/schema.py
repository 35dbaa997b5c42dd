"""The database schema: numbered migrations, then the function files, under one advisory lock.

Tables, types, indexes and signature changes are numbered forward-only migrations
(`db/migrations/NNN_name.sql`), recorded in `dispatcher.migrations`. The body of every function,
view and trigger is one file in `db/functions/` (`CREATE OR REPLACE`), applied after the
migrations, in name order, in the same transaction; `dispatcher.function_files` records the
content hash of each and the release that applied it, so `migrate` applies only what changed and
a daemon of an older release sees that the database holds other bodies and refuses.

`dispatcher restore` holds the same lock for its whole transaction (db/backup.py), so a daemon or
a command that arrives meanwhile never races it (racing it, `CREATE SCHEMA` waited on the
restore's uncommitted schema and then failed with a raw UniqueViolationError): `migrate` says
who holds the lock every few seconds and waits up to its bound, then gives up in one line; the
schema checks name a restore in progress, or a schema present only in part, in one line too.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
import time
from importlib import resources

import asyncpg

from dispatcher import __version__
from dispatcher.errors import SchemaBusy, SchemaIncomplete, SchemaMismatch

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same in every dispatcher process.
MIGRATION_LOCK = 0x6469_7370
# What `dispatcher restore` calls its loading session, so others can name it.
RESTORE_APPLICATION = "dispatcher-restore"
DEFAULT_WAIT_S = 60.0
LOCK_POLL_S = 0.2
SAY_EVERY_S = 5.0


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


@functools.cache
def function_files() -> tuple[tuple[str, str, str], ...]:
    """(name, sql, sha256 of the text) of every function file shipped with this release, in
    the order they are applied: by name, so the tier prefix (10 functions, 20 views, 30
    triggers) puts what a file needs before it."""
    folder = resources.files("dispatcher.db").joinpath("functions")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            sql = entry.read_text()
            found.append((entry.name, sql, hashlib.sha256(sql.encode()).hexdigest()))
    return tuple(sorted(found))


async def migrate(
    conn: asyncpg.Connection, upto: int | None = None, *, wait_s: float = DEFAULT_WAIT_S
) -> list[str]:
    """Apply pending migrations (those numbered up to `upto`, when given: tests of one
    migration start from the schema before it); return the names applied. While a restore or
    another migration holds the lock, wait up to `wait_s` saying so, then raise SchemaBusy."""
    deadline = time.monotonic() + wait_s
    said_at = None
    while True:
        async with conn.transaction():
            if await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", MIGRATION_LOCK):
                applied_now = await _apply(conn, upto)
                break
        holder = await lock_holder(conn) or "another session holds the migration lock"
        now = time.monotonic()
        if now >= deadline:
            raise SchemaBusy(f"{holder}; gave up after waiting {wait_s:.0f} s (database_wait_s)")
        if said_at is None or now - said_at >= SAY_EVERY_S:
            log.warning("%s; waiting (up to %.0f s more)", holder, deadline - now)
            said_at = now
        await asyncio.sleep(LOCK_POLL_S)
    for name in applied_now:
        log.info("applied migration %s", name)
    return applied_now


async def _apply(conn: asyncpg.Connection, upto: int | None) -> list[str]:
    """Under the lock: apply what is missing, on a schema that is either absent or whole, and
    never on one a newer release wrote (its functions would be replaced by older ones)."""
    await check_not_partial(conn)
    await conn.execute("CREATE SCHEMA IF NOT EXISTS dispatcher")
    await conn.execute(
        """CREATE TABLE IF NOT EXISTS dispatcher.migrations (
               version integer PRIMARY KEY, name text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )
    await conn.execute(
        """CREATE TABLE IF NOT EXISTS dispatcher.function_files (
               name text PRIMARY KEY, sha256 text NOT NULL, release text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )
    done = {r["version"] for r in await conn.fetch("SELECT version FROM dispatcher.migrations")}
    newest = max(done, default=0)
    if newest > latest_version():
        raise SchemaMismatch(_newer_schema(newest) + "; nothing was changed")
    applied_now = []
    for version, name, sql in available():
        if version in done or (upto is not None and version > upto):
            continue
        if _has_statements(sql):  # some hold only the history of bodies now in db/functions/
            await conn.execute(sql)
        await conn.execute(
            "INSERT INTO dispatcher.migrations (version, name) VALUES ($1, $2)", version, name
        )
        applied_now.append(name)
    # The files are written against the last migration's tables: a schema stopped short of
    # it (a test of one migration) gets none, and its first full migrate applies them all.
    # After a migration every file is applied again, whatever its hash: a migration may have
    # dropped what a file creates (a view whose columns change, with its triggers).
    if upto is None or upto >= latest_version():
        applied_now += await _apply_function_files(conn, every=bool(applied_now))
    return applied_now


def _has_statements(sql: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("--") for line in sql.splitlines())


async def _apply_function_files(conn: asyncpg.Connection, *, every: bool) -> list[str]:
    """Apply the function files whose text the database does not hold (`every`: all of them),
    forget those no longer shipped, and return the names applied (as `functions/NAME`)."""
    held = await _held_files(conn)
    differ = _files_that_differ(held)
    if not differ and not every:
        return []
    newer = _newer_release(held)
    if newer is not None:
        raise SchemaMismatch(_newer_functions(newer, differ) + "; nothing was changed")
    shipped = [name for name, _, _ in function_files()]
    if every:
        differ |= set(shipped)
    for name, sql, digest in function_files():
        if name in differ:
            await conn.execute(sql)
            await conn.execute(
                """INSERT INTO dispatcher.function_files (name, sha256, release)
                   VALUES ($1, $2, $3)
                   ON CONFLICT (name) DO UPDATE
                      SET sha256 = $2, release = $3, applied_at = now()""",
                name,
                digest,
                __version__,
            )
    await conn.execute(
        "DELETE FROM dispatcher.function_files WHERE NOT name = ANY ($1::text[])", shipped
    )
    return [f"functions/{name}" for name in sorted(differ) if name in shipped]


async def _held_files(conn: asyncpg.Connection) -> dict[str, tuple[str, str]]:
    """name -> (sha256, release) of the function files the database holds; none before the
    first migrate of a release that has them."""
    if not await conn.fetchval("SELECT to_regclass('dispatcher.function_files') IS NOT NULL"):
        return {}
    rows = await conn.fetch("SELECT name, sha256, release FROM dispatcher.function_files")
    return {r["name"]: (r["sha256"], r["release"]) for r in rows}


def _files_that_differ(held: dict[str, tuple[str, str]]) -> set[str]:
    """Names of the files this release ships with other text than the database holds, or
    that the database holds and this release does not ship."""
    shipped = {name: digest for name, _, digest in function_files()}
    differ = {name for name, digest in shipped.items() if held.get(name, ("",))[0] != digest}
    return differ | (held.keys() - shipped.keys())


def _newer_release(held: dict[str, tuple[str, str]]) -> str | None:
    """The newest release that wrote a held file, when it is newer than this one."""
    releases = sorted({release for _, release in held.values()}, key=_release_order)
    if releases and _release_order(releases[-1]) > _release_order(__version__):
        return releases[-1]
    return None


def _release_order(release: str) -> tuple[int, ...]:
    """`1.4.10` as (1, 4, 10): the leading numbers of a release, so 1.10 sorts after 1.9."""
    numbers = re.match(r"\d+(?:\.\d+)*", release)
    return tuple(int(n) for n in numbers.group().split(".")) if numbers else ()


def _newer_schema(version: int) -> str:
    return (
        f"database schema is at version {version}, newer than this release knows "
        f"({latest_version()}, dispatcher {__version__}): run a dispatcher release at least as "
        "new as the one that migrated it"
    )


def _newer_functions(release: str, differ: set[str]) -> str:
    return (
        f"the database's SQL functions were written by dispatcher {release}, newer than this "
        f"release ({__version__}; {len(differ)} of its function files differ, e.g. "
        f"{min(differ)}): run dispatcher {release} or newer"
    )


async def lock_holder(conn: asyncpg.Connection) -> str | None:
    """Who holds the migration lock, in words: a restore (named by `dispatcher restore`'s
    session) or another process's migration; None when nobody does."""
    row = await conn.fetchrow(
        """SELECT a.pid, a.application_name,
                  extract(epoch FROM now() - a.xact_start)::float8 AS for_s
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
              AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid
              AND l.database = (SELECT d.oid FROM pg_database d
                                 WHERE d.datname = current_database())
              AND l.pid <> pg_backend_pid()
            LIMIT 1""",
        MIGRATION_LOCK,
    )
    if row is None:
        return None
    for_s = f", for {row['for_s']:.0f} s" if row["for_s"] is not None else ""
    if row["application_name"] == RESTORE_APPLICATION:
        return f"a dispatcher restore is loading this database (pid {row['pid']}{for_s})"
    return (
        f"another session is migrating this database (pid {row['pid']}, "
        f"{row['application_name'] or 'no application name'}{for_s})"
    )


async def check_not_partial(conn: asyncpg.Connection) -> None:
    """Refuse a dispatcher schema that has tables but no migration record: a restore that did
    not finish (pg_restore run by hand, outside one transaction) or one still loading so."""
    row = await conn.fetchrow(
        """SELECT count(*) FILTER (WHERE c.relname NOT IN ('migrations', 'function_files'))
                      AS tables,
                  to_regclass('dispatcher.migrations') IS NOT NULL AS has_record
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'dispatcher' AND c.relkind IN ('r', 'p')"""
    )
    if not row["tables"]:
        return
    recorded = row["has_record"] and await conn.fetchval(
        "SELECT count(*) FROM dispatcher.migrations"
    )
    if not recorded:
        raise SchemaIncomplete(
            f"the dispatcher schema is incomplete ({row['tables']} tables, no migration "
            "record): a restore that did not finish, or one still loading outside dispatcher "
            "restore. Restore the backup whole (dispatcher restore --force FILE) or drop the "
            "schema dispatcher; nothing was changed"
        )


async def current_version(conn: asyncpg.Connection) -> int | None:
    exists = await conn.fetchval("SELECT to_regclass('dispatcher.migrations') IS NOT NULL")
    if not exists:
        return None
    version: int | None = await conn.fetchval("SELECT max(version) FROM dispatcher.migrations")
    return version


async def check_current(conn: asyncpg.Connection) -> None:
    """Refuse a schema this release cannot run on: absent, in part, at another migration
    version, or holding other function bodies than this release ships."""
    version = await current_version(conn)
    expected = latest_version()
    if version is None:
        holder = await lock_holder(conn)
        if holder is not None:
            raise SchemaBusy(f"{holder}; try again once it has finished")
        await check_not_partial(conn)
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
        raise SchemaMismatch(_newer_schema(version))
    held = await _held_files(conn)
    differ = _files_that_differ(held)
    if differ:
        newer = _newer_release(held)
        if newer is not None:
            raise SchemaMismatch(_newer_functions(newer, differ))
        raise SchemaMismatch(
            f"the database's SQL functions differ from this release's ({len(differ)} function "
            f"files, e.g. {min(differ)}): run `dispatcher migrate` (or enable auto_migrate)"
        )
