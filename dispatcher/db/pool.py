"""Connection pool creation, JSON codecs, and translation of driver errors at the boundary."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import asyncpg

from dispatcher.config.connection_budget import ConnectionBudget
from dispatcher.config.settings import mask_url
from dispatcher.core import jsoncodec
from dispatcher.errors import DatabaseUnavailable, DispatcherError
from dispatcher.observability import metrics
from dispatcher.runtime.lifecycle import Service

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

# Errors that mean "the server is not there (yet)", worth a retry with backoff at start-up.
CONNECT_ERRORS = (
    OSError,
    asyncpg.CannotConnectNowError,
    asyncpg.ConnectionDoesNotExistError,
    asyncio.TimeoutError,
)

# Errors that mean "the database cannot serve this request now; the same request may succeed
# later": no connection (refused, reset, timed out: all OSError), a connection lost (class 08),
# a server starting, stopping or crashed (57P0x), out of connection slots (53300), or its disk
# full (53100: the write is refused whole and succeeds once space is freed).
UNAVAILABLE_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.DiskFullError,
)


# What a service that keeps a connection of its own (the wake-up listener, the liveness lock)
# reconnects on: the server's refusals and errors, the socket gone or timed out, the driver's
# closed connection, and its protocol state broken by a server restart mid-statement
# (InternalClientError "cannot switch to state 12": it killed the liveness lock, and with it the
# daemon, three times in the 60-minute chaos soak).
RECONNECT_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database is unreachable, rather than that the request is wrong."""
    if isinstance(exc, asyncpg.InternalClientError):
        # The driver's protocol state broke, e.g. a server restart cut a connection while the
        # pool handed it back ("cannot switch to state 12; another operation (2) is in
        # progress", asyncpg issue 784): the statement may have run, the connection is gone.
        # Like an outage, the same request may succeed later (intake is idempotent by key).
        return True
    if isinstance(exc, asyncpg.InterfaceError):
        # "connection is closed", "pool is closing": the rest (bad arguments) are bugs. An
        # argument the driver could not encode (a ValueError) quotes the argument, whose text
        # may say anything, "closed" too: it is never an outage.
        if isinstance(exc, ValueError):
            return False
        return "closed" in str(exc) or "closing" in str(exc)
    return isinstance(exc, UNAVAILABLE_ERRORS)


def translate_unavailable(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate a repository method: the driver's unreachable-database errors leave it as
    `DatabaseUnavailable` (which the API answers with 503), everything else unchanged."""

    @functools.wraps(method)
    async def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except (*UNAVAILABLE_ERRORS, asyncpg.InterfaceError, asyncpg.InternalClientError) as exc:
            if not is_unavailable(exc):
                raise
            if isinstance(exc, asyncpg.DiskFullError):
                metrics.DATABASE_DISK_FULL.inc()
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise DatabaseUnavailable(f"database unavailable ({reason})") from exc

    return translated


async def _init_connection(conn: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(
            name,
            encoder=jsoncodec.dumps,
            decoder=jsoncodec.loads,
            schema="pg_catalog",
            format="text",
        )


POOLER_FIX = (
    "database_url goes through a pooler that moves statements between server sessions "
    "(PgBouncer pool_mode=transaction or statement, Supavisor's transaction port): LISTEN "
    'there never hears a wake-up. Set database.wakeups = "poll" '
    "(DISPATCHER_DATABASE__WAKEUPS=poll), or point DISPATCHER_DATABASE_URL at PostgreSQL or "
    "a session-mode pool (docs/pooling.md)"
)


STARTUP_FIX = (
    "the server refused the session settings sent at connection start, as PgBouncer does: "
    'behind a transaction pooler set database.wakeups = "poll" '
    "(DISPATCHER_DATABASE__WAKEUPS=poll); behind a session-mode PgBouncer add them to its "
    "ignore_startup_parameters (docs/pooling.md)"
)


class PoolerError(DispatcherError):
    """The database URL goes through a pooler the configured mode cannot use."""


# What each connection of a daemon asks of its server session. Behind a transaction pooler
# (database.wakeups = "poll") it may ask nothing: PgBouncer refuses any startup parameter it does
# not track ("unsupported startup parameter: plan_cache_mode"), and a named prepared statement
# lives on one server session while the next transaction may run on another (PgBouncer before
# 1.21 keeps no prepared statements at all). Without the statement cache, asyncpg sends every
# statement, and `prepare()`, as the unnamed statement, planned with its parameters each time.
SESSION_SETTINGS = {
    # Batch statements take arrays of 1 to 2,000 items; a cached generic plan assumes
    # ~10 and turns them quadratic, so always plan with the actual parameters.
    "plan_cache_mode": "force_custom_plan",
    # Claims on a large table cross the JIT cost threshold; compiling took 17 ms of a
    # 30 ms claim of 1,000 jobs. Short statements never win that back.
    "jit": "off",
}


def session_options(application_name: str, *, pooled: bool) -> dict[str, Any]:
    """asyncpg's connection options: the session settings, or (`pooled`) none of them and no
    statement cache; application_name is one a pooler passes on."""
    if pooled:
        return {
            "server_settings": {"application_name": application_name},
            "statement_cache_size": 0,
        }
    return {"server_settings": {"application_name": application_name, **SESSION_SETTINGS}}


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without the reset query: see `create_pool`."""


async def create_pool(
    dsn: str,
    *,
    size: int,
    application_name: str = "dispatcher",
    min_size: int = 2,
    pooled: bool = False,
    reset_sessions: bool = True,
) -> asyncpg.Pool:
    """`reset_sessions=False` for pools that run only the daemon's own statements, which leave
    no session state (no LISTEN, SET, cursor or session lock): a release then sends no
    `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL` (asyncpg still rolls
    back an open transaction). That query was half the statements of an idle daemon
    (tests/bench/bench_idle.py) and a round trip after every pooled statement. Pools that lend
    connections to handlers' code keep it."""
    try:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min(min_size, size),
            max_size=size,
            init=_init_connection,
            command_timeout=60,
            reset=None if reset_sessions else _keep_session,
            **session_options(application_name, pooled=pooled),
        )
    except asyncpg.ProtocolViolationError as exc:  # PgBouncer: the session settings
        if "unsupported startup parameter" not in str(exc):
            raise
        raise PoolerError(f"{exc}: {STARTUP_FIX}") from None
    assert pool is not None
    return pool


async def connect(dsn: str, *, pooled: bool = False) -> asyncpg.Connection:
    """One connection for start-up and commands: no session settings; `pooled`: no cache."""
    cache = {"statement_cache_size": 0} if pooled else {}
    conn = await asyncpg.connect(dsn, server_settings={"application_name": "dispatcher"}, **cache)
    await _init_connection(conn)
    return conn


async def wait_for_database(dsn: str, *, timeout_s: float, log_every_s: float = 5.0) -> None:
    """Wait until the server accepts connections, backing off (0.2 s doubling to 5 s)."""
    deadline = time.monotonic() + timeout_s
    delay, last_log = 0.2, 0.0
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
            await conn.close()
            return
        except (
            *CONNECT_ERRORS,
            asyncpg.InvalidCatalogNameError,
            asyncpg.TooManyConnectionsError,  # a full server may have room again soon
        ) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            full = isinstance(exc, asyncpg.TooManyConnectionsError)
        now = time.monotonic()
        if now >= deadline:
            fix = (
                "the server has no free connection slot: close other clients' connections or "
                "raise its max_connections (docs/connections.md)"
                if full
                else "check DISPATCHER_DATABASE_URL, or unset it to use the embedded database"
            )
            raise DatabaseUnavailable(
                f"database {mask_url(dsn)} not reachable after {timeout_s:.0f} s ({reason}); {fix}"
            )
        if now - last_log >= log_every_s:
            log.warning("database not reachable yet, retrying: %s", reason)
            last_log = now
        await asyncio.sleep(min(delay, deadline - now))
        delay = min(delay * 2, 5.0)


class PoolSet(Service):
    """The daemon's connection pools, one per kind of work, so none can starve another, sized
    by its connection budget (dispatcher/config/connection_budget.py; docs/connections.md):

    - `api`: intake and operator reads;
    - `engine`: completions, failures, the due-scan, cron, sampling, pruning, the RabbitMQ relay:
      short statements only;
    - `claims`: the claim connections every queue's claim loop borrows (db/claims.py);
    - `lease`: one connection for the heartbeat alone, so leases are renewed whatever else waits;
    - `handlers`: transactional effects, which hold a connection for their whole run.
    """

    name = "database-pools"

    def __init__(self, dsn: str, budget: ConnectionBudget, *, pooled: bool = False):
        self._dsn = dsn
        self.budget = budget
        self._pooled = pooled  # behind a transaction pooler: no session state (docs/pooling.md)
        self._sizes = {
            "api": budget.api,
            "engine": budget.engine,
            "claims": budget.claims,
            "lease": 1,
            "handlers": budget.handlers,
        }
        self._pools: dict[str, asyncpg.Pool] = {}

    def __getitem__(self, kind: str) -> asyncpg.Pool:
        return self._pools[kind]

    async def start(self) -> None:
        for kind, size in self._sizes.items():
            # claim and handler connections are opened on demand: a claim connection per loop
            # claiming at once, and many deployments have no transactional handler
            self._pools[kind] = await create_pool(
                self._dsn,
                size=size,
                application_name=f"dispatcher:{kind}",
                min_size=0 if kind in ("claims", "handlers") else 2,
                pooled=self._pooled,
                reset_sessions=kind == "handlers",  # handlers' code may leave session state
            )

    async def stop(self) -> None:
        pools, self._pools = self._pools, {}
        try:  # close gracefully; connections a dead server never answers are cut
            async with asyncio.timeout(5):
                await asyncio.gather(*(p.close() for p in pools.values()))
        except (TimeoutError, *CONNECT_ERRORS, asyncpg.PostgresError):
            for p in pools.values():
                p.terminate()
