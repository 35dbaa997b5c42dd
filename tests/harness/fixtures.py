"""The shared fixtures that run daemons or set a test database up as a daemon would: defined
here once, made available to every module by tests/conftest.py. A module configures them by
overriding a small fixture (`daemon_env`, `module_daemon_env`) or by a marker (`registry`),
never by defining its own copy.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from tests.harness.daemons import LOOPBACK_ENV, DaemonHandle, DaemonProcess, running_daemon

Spawn = Callable[..., Awaitable[DaemonProcess]]
_counter = itertools.count()


@pytest.fixture
async def spawn() -> AsyncIterator[Spawn]:
    """`await spawn(env)`: start `dispatcher run` children (ready unless `wait_ready=False`;
    `port=` to choose its port, `unset=` names to drop from the inherited environment);
    whatever the test does, none outlives it."""
    started: list[DaemonProcess] = []

    async def start(
        env: dict[str, str],
        *,
        wait_ready: bool = True,
        port: int | None = None,
        unset: tuple[str, ...] = (),
    ) -> DaemonProcess:
        daemon = DaemonProcess(env, port=port)
        for name in unset:  # variables of the test's own environment the child must not see
            daemon.env.pop(name, None)
        started.append(daemon)
        return await daemon.start(wait_ready=wait_ready)

    yield start
    for daemon in started:
        await daemon.kill()


async def _stopped_cleanly(daemon: DaemonProcess) -> None:
    """SIGTERM a daemon the test left running and require exit 0 (one it ended itself, by a
    signal or a crash it caused, is the test's business)."""
    if daemon.proc is not None and daemon.proc.returncode is None:
        code = await daemon.stop()
        assert code == 0, f"exit {code}: {daemon.log_text()[-3000:]}"


@pytest.fixture
def daemon_env() -> dict[str, str]:
    """The `daemon` fixture's settings, as DISPATCHER_* variables: override it in a module."""
    return {}


@pytest.fixture
def daemon_in_process() -> bool:
    """Override with True where the tests need the `Daemon` object (`daemon.daemon`)."""
    return False


@pytest.fixture
async def daemon(
    db_url: str, daemon_env: dict[str, str], daemon_in_process: bool, spawn: Spawn
) -> AsyncIterator[DaemonHandle]:
    """A ready daemon on the test's database, with `daemon_env` over loopback delivery; stopped
    at the end (exit 0 required)."""
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV, **daemon_env}
    if daemon_in_process:
        async with running_daemon(env) as running:
            yield running
        return
    process = await spawn(env)
    yield process
    await _stopped_cleanly(process)


@pytest.fixture(scope="module")
async def module_db_url(server_url: str, template_url: str) -> AsyncIterator[str]:
    """A migrated database that lives as long as the test module."""
    from tests.conftest import database_name, scratch_database

    name = f"dispatcher_mod{os.getpid()}_{next(_counter)}"
    async with scratch_database(server_url, name, database_name(template_url)) as url:
        yield url


@pytest.fixture(scope="module")
def module_daemon_env() -> dict[str, str]:
    """The `module_daemon` fixture's settings: override it in a module (or a conftest)."""
    return {}


@pytest.fixture(scope="module")
async def module_daemon(
    module_db_url: str, module_daemon_env: dict[str, str]
) -> AsyncIterator[DaemonProcess]:
    """One daemon process shared by the tests of a module (a long-lived server for hostile
    clients, or a data set seeded once), on `module_db_url`; stopped at the end (exit 0)."""
    process = DaemonProcess({"DISPATCHER_DATABASE_URL": module_db_url, **module_daemon_env})
    try:
        yield await process.start()
        await _stopped_cleanly(process)
    finally:
        await process.kill()


@pytest.fixture
async def relay_transport(pool: asyncpg.Pool) -> None:
    """The test database as a daemon with a relay transport (RabbitMQ) leaves it: a ready job
    gets an outbox row (in process the door writes none: tests/db/test_sql_door.py). Use it
    with `pytestmark = pytest.mark.usefixtures("relay_transport")`; the `api` fixture, which
    writes the registry as a daemon's start does, keeps it so."""
    await pool.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the test database, as an application would have (no dispatcher
    codecs registered)."""
    connection = await asyncpg.connect(db_url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def registry(repo: JobRepository, request: pytest.FixtureRequest) -> JobRepository:
    """The registry (queues, handlers) a daemon writes at start, as the module's
    `@pytest.mark.registry(queues, handlers, **options)` names it (the arguments of
    `JobRepository.sync_registry`); the repository is returned."""
    marker = request.node.get_closest_marker("registry")
    if marker is None:
        raise pytest.UsageError("the registry fixture needs @pytest.mark.registry(...)")
    args: tuple[Any, ...] = marker.args
    await repo.sync_registry(*args, **marker.kwargs)
    return repo
