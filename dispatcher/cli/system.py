"""The commands that run or look after the daemon and its database: run, migrate, config,
check-config, db-url, backup, restore, and the console's sessions."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dispatcher.cli.common import EXIT_FAILURE, EXIT_USAGE, client_bin_dir, database
from dispatcher.config.settings import Settings
from dispatcher.console import admin as console_admin
from dispatcher.errors import DispatcherError


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.daemon import Daemon
    from dispatcher.observability import tracing

    try:  # the standard OTEL_* variables; off unless they ask for an exporter
        traced = tracing.from_environment()
    except DispatcherError as exc:
        print(f"dispatcher: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        import uvloop

        runner: Callable[[Awaitable[int]], int] = uvloop.run  # type: ignore[assignment]
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back if unavailable
        runner = asyncio.run  # type: ignore[assignment]

    async def run() -> int:
        return await Daemon(settings, traced).run()

    return runner(run())


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db import schema

    async def run() -> int:
        async with (
            database(settings, check_schema=False, create=True) as (_dsn, pool),
            pool.acquire() as conn,
        ):
            applied = await schema.migrate(conn, wait_s=settings.database_wait_s)
        print("applied: " + ", ".join(applied) if applied else "schema is current")
        return 0

    return asyncio.run(run())


def cmd_check_config(settings: Settings, args: argparse.Namespace) -> int:
    print(json.dumps(settings.public_view(), indent=2, default=str))
    return 0


def cmd_db_url(settings: Settings, args: argparse.Namespace) -> int:
    """The URL alone on stdout (`psql "$(dispatcher db-url)"`); the advice on stderr."""
    import shlex

    from dispatcher.config.settings import mask_url
    from dispatcher.db.embedded import connection_url

    if settings.database_url is not None:
        print(mask_url(settings.database_url.get_secret_value()))
        print(
            "dispatcher: an external PostgreSQL (database_url; password masked): connect with "
            'the URL you configured, e.g. psql "$DISPATCHER_DATABASE_URL"',
            file=sys.stderr,
        )
        return 0
    url, running = connection_url(settings.state_dir)
    print(url)
    psql = client_bin_dir(settings) / "psql"
    print(
        f"connect with: {shlex.quote(str(psql)) if psql.exists() else 'psql'} {shlex.quote(url)}",
        file=sys.stderr,
    )
    if not running:
        print(
            f"dispatcher: the embedded PostgreSQL in {settings.state_dir.absolute()} is not "
            "running: it runs while `dispatcher run` does; start the daemon, then connect",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return 0


def cmd_config(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher import share

    print("\n".join(share.shipped()) if args.list else share.example(args.name), end="")
    if args.list:
        print()
    return 0


def cmd_backup(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db.backup import BackupRepository, dump

    file = Path(args.file)
    if file.exists() and not args.force:
        print(f"dispatcher: {file} exists; pass --force to replace it", file=sys.stderr)
        return EXIT_USAGE
    if not file.absolute().parent.is_dir():
        print(f"dispatcher: {file.absolute().parent} is not a directory", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        async with database(settings, check_schema=False) as (dsn, pool):
            await refuse_while_restoring(pool)
            if not await BackupRepository(pool).schema_exists():
                print(
                    "dispatcher: this database has no dispatcher schema to back up "
                    "(run dispatcher migrate or the daemon first)",
                    file=sys.stderr,
                )
                return EXIT_FAILURE
            size = await asyncio.to_thread(dump, dsn, file, client_bin_dir(settings))
        print(f"backed up the dispatcher schema to {file} ({size} bytes)")
        return 0

    return asyncio.run(run())


async def refuse_while_restoring(pool: Any) -> None:
    """A backup or a second restore while a restore loads: say so (SchemaBusy), in one line."""
    from dispatcher.db import schema
    from dispatcher.errors import SchemaBusy

    async with pool.acquire() as conn:
        holder = await schema.lock_holder(conn)
    if holder is not None:
        raise SchemaBusy(f"{holder}; try again once it has finished")


def cmd_restore(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db.backup import BackupRepository, check_archive, restore

    file = Path(args.file)
    check_archive(file, client_bin_dir(settings))  # a wrong file changes nothing

    async def run() -> int:
        async with database(settings, check_schema=False, create=True) as (dsn, pool):
            await refuse_while_restoring(pool)
            repo = BackupRepository(pool)
            if await repo.daemon_sessions():
                print(
                    "dispatcher: a daemon is connected to this database; stop every "
                    "dispatcher run on it, then restore",
                    file=sys.stderr,
                )
                return EXIT_FAILURE
            if await repo.schema_exists() and not args.force:
                print(
                    "dispatcher: this database already has a dispatcher schema; restore into "
                    "an empty one (a new state directory), or pass --force to replace it",
                    file=sys.stderr,
                )
                return EXIT_FAILURE
            bin_dir = client_bin_dir(settings)
            version = await repo.server_version()
            await asyncio.to_thread(
                restore, dsn, file, bin_dir, server_version=version, replace=args.force
            )
            contents = await repo.contents()
        print(f"restored {file}: {contents.jobs} jobs, {contents.runs} run receipts")
        return 0

    return asyncio.run(run())


def cmd_console(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db.sessions import SessionRepository

    async def run() -> int:
        async with database(settings) as (_dsn, pool):
            return await console_admin.sessions_command(SessionRepository(pool), args)

    return asyncio.run(run())
