"""Starting the database a daemon runs on: the configured server or the embedded one,
waited for, migrated (or checked), its capacity and vacuum settings looked at; and the tracing
service, which the daemon starts first and stops last."""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack

from dispatcher.config.settings import Settings, mask_url
from dispatcher.db import schema
from dispatcher.db.capacity import check_capacity
from dispatcher.db.embedded import EmbeddedPostgres
from dispatcher.db.notifications import check_sessions_stay
from dispatcher.db.ownership import Role
from dispatcher.db.pool import connect, wait_for_database
from dispatcher.db.vacuum import vacuum_problems
from dispatcher.observability import logs
from dispatcher.observability.tracing import Tracing, current_trace_id
from dispatcher.runtime.lifecycle import CallbackService, Service

log = logging.getLogger("dispatcher")


async def resolve_database(
    settings: Settings, stack: AsyncExitStack, role: Role = "daemon", *, create: bool = True
) -> str:
    """The configured URL, or the embedded server's: a daemon owns it (starts it now, stops it
    at exit); a command attaches to a running daemon's, or owns it for its own short life.
    `create=False`: an embedded database that does not exist yet is refused, not created."""
    if settings.database_url is not None:
        url = settings.database_url.get_secret_value()
        if role == "daemon":
            log.info("using the external PostgreSQL at %s (database_url)", mask_url(url))
        return url
    embedded = EmbeddedPostgres(
        settings.state_dir,
        role=role,
        bin_dir=settings.embedded_postgres_bin,
        wait_s=settings.database_wait_s,
        create=create,
    )
    dsn = await asyncio.to_thread(embedded.start)
    stack.callback(embedded.stop)
    return dsn


async def prepare_schema(dsn: str, settings: Settings) -> None:
    if settings.database.wakeups == "listen" and settings.database_url is not None:
        await check_sessions_stay(dsn)  # LISTEN behind a transaction pooler hears nothing
    conn = await connect(dsn, pooled=settings.database.pooled)
    try:
        if settings.auto_migrate:  # waits, saying so, while a restore loads the database
            await schema.migrate(conn, wait_s=settings.database_wait_s)
        else:
            await schema.check_current(conn)
        for problem in await vacuum_problems(conn):
            log.warning(problem)
        await check_capacity(conn, settings.connection_budget())
    finally:
        await conn.close()


class Database(Service):
    """The configured database, or the embedded server (started first, stopped last); start-up
    waits for it to accept connections, then migrates (or checks) the schema."""

    name = "database"
    stop_timeout_s = 30.0

    def __init__(self, settings: Settings):
        self._settings = settings
        self._stack = AsyncExitStack()
        self.dsn = ""

    async def start(self) -> None:
        try:
            self.dsn = await resolve_database(self._settings, self._stack)
            await wait_for_database(self.dsn, timeout_s=self._settings.database_wait_s)
            await prepare_schema(self.dsn, self._settings)
        except BaseException:
            await self._stack.aclose()
            raise

    async def stop(self) -> None:
        await self._stack.aclose()


def tracing_service(tracing: Tracing | None) -> Service:
    """Says where spans go and puts trace ids on log lines; at stop, exports what is buffered
    (off: does nothing)."""

    async def start() -> None:
        if tracing is not None:
            logs.with_trace_ids(current_trace_id)
            log.info("tracing on: spans go to %s", tracing.about)

    async def stop() -> None:
        if tracing is not None:  # the exporter's own timeout bounds this
            logs.with_trace_ids(None)
            await asyncio.to_thread(tracing.close)

    return CallbackService("tracing", start, stop)
