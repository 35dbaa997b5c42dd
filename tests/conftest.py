"""Shared fixtures: a real PostgreSQL (embedded unless DATABASE_URL is set), a migrated template
database, and a fresh clone of it for every test that asks for one."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from dispatcher.db import schema
from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import connect, create_pool
from tests.harness.fixtures import (  # noqa: F401 (fixtures: the one definition of each)
    conn,
    daemon,
    daemon_env,
    daemon_in_process,
    module_daemon,
    module_daemon_env,
    module_db_url,
    registry,
    relay_transport,
    spawn,
)
from tests.service.intake_app import Api, serve_api
from tests.suite import (  # noqa: F401 (hooks: the quick default, --full, --with; docs/running-tests.md)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_ignore_collect,
    pytest_report_header,
)
from tests.transports import transport  # noqa: F401 (a fixture: both transports)


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    from dispatcher.db.embedded import EmbeddedPostgres

    state = tempfile.mkdtemp(prefix="dispatcher-test-")
    embedded = EmbeddedPostgres(__import__("pathlib").Path(state))
    yield embedded.start()
    embedded.stop()
    shutil.rmtree(state, ignore_errors=True)


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, name: str, template: str = "") -> AsyncIterator[str]:
    """Database `name` on the server (empty, or a copy of `template`), dropped on exit."""
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        clone = f' TEMPLATE "{template}"' if template else ""
        await admin.execute(f'CREATE DATABASE "{name}"{clone}')
        yield with_database(server_url, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


@pytest.fixture(scope="session")
async def template_url(server_url: str) -> AsyncIterator[str]:
    async with scratch_database(server_url, f"dispatcher_template_{os.getpid()}") as url:
        conn = await connect(url)
        await schema.migrate(conn)
        await conn.close()
        yield url


_counter = itertools.count()


@pytest.fixture
async def db_url(server_url: str, template_url: str) -> AsyncIterator[str]:
    """A fresh, migrated database for one test (cloned from the template)."""
    name = f"dispatcher_t{os.getpid()}_{next(_counter)}"
    async with scratch_database(server_url, name, database_name(template_url)) as url:
        yield url


@pytest.fixture(scope="module")
async def module_pools(
    server_url: str, template_url: str
) -> AsyncIterator[Callable[[], Awaitable[asyncpg.Pool]]]:
    """Fresh migrated databases that live as long as the test module (each call clones the
    template again): for tests that only read one large data set, built once for all of them
    instead of once per test (a 30,000-job table takes seconds to fill on a loaded machine)."""
    async with contextlib.AsyncExitStack() as stack:

        async def new_pool() -> asyncpg.Pool:
            name = f"dispatcher_m{os.getpid()}_{next(_counter)}"
            clone = scratch_database(server_url, name, database_name(template_url))
            p = await create_pool(await stack.enter_async_context(clone), size=10)
            stack.push_async_callback(lambda: asyncio.wait_for(p.close(), 10))
            return p

        yield new_pool


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(db_url, size=10)
    yield p
    await asyncio.wait_for(p.close(), 10)


@pytest.fixture
async def repo(pool: asyncpg.Pool) -> JobRepository:
    return JobRepository(pool)


@pytest.fixture
async def empty_db_url(server_url: str) -> AsyncIterator[str]:
    """A database without any dispatcher schema."""
    async with scratch_database(server_url, f"dispatcher_empty_{os.getpid()}") as url:
        yield url


@pytest.fixture
async def api(pool: asyncpg.Pool, request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    """The HTTP API as the daemon builds it, on a real loopback socket (service/intake_app.py);
    with the `relay_transport` fixture, as a daemon with a relay transport builds it."""
    relayed = "relay_transport" in request.fixturenames
    async with serve_api(pool, ready_outbox=relayed) as served:
        yield served
