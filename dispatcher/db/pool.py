"""Connection pool creation, JSON codecs, and translation of driver errors at the boundary."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import asyncpg

from dispatcher import jsoncodec
from dispatcher.config import mask_url
from dispatcher.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

# Errors that mean "the server is not there (yet)", worth a retry with backoff at start-up.
CONNECT_ERRORS = (
    OSError,
    asyncpg.CannotConnectNowError,
    asyncpg.ConnectionDoesNotExistError,
    asyncio.TimeoutError,
)


async def _init_connection(conn: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(
            name,
            encoder=jsoncodec.dumps,
            decoder=json.loads,
            schema="pg_catalog",
            format="text",
        )


async def create_pool(dsn: str, *, size: int, application_name: str = "dispatcher") -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min(2, size),
        max_size=size,
        init=_init_connection,
        server_settings={
            "application_name": application_name,
            # Batch statements take arrays of 1 to 2,000 items; a cached generic plan assumes
            # ~10 and turns them quadratic, so always plan with the actual parameters.
            "plan_cache_mode": "force_custom_plan",
            # Claims on a large table cross the JIT cost threshold; compiling took 17 ms of a
            # 30 ms claim of 1,000 jobs. Short statements never win that back.
            "jit": "off",
        },
        command_timeout=60,
    )
    assert pool is not None
    return pool


async def connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn, server_settings={"application_name": "dispatcher"})
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
        except (*CONNECT_ERRORS, asyncpg.InvalidCatalogNameError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if now >= deadline:
            raise DatabaseUnavailable(
                f"database {mask_url(dsn)} not reachable after {timeout_s:.0f} s ({reason}); "
                "check DISPATCHER_DATABASE_URL, or unset it to use the embedded database"
            )
        if now - last_log >= log_every_s:
            log.warning("database not reachable yet, retrying: %s", reason)
            last_log = now
        await asyncio.sleep(min(delay, deadline - now))
        delay = min(delay * 2, 5.0)
