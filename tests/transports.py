"""Both transports for the same tests: `transport` is a fixture parametrised over the in-process
transport and RabbitMQ (the broker on 127.0.0.1:5672, guest/guest). It yields settings
overrides for `make_settings`; the rabbitmq variant uses a queue prefix of its own and deletes
its queues afterwards, and is skipped, saying why, when no broker answers.

A module uses it by importing it: `from tests.transports import transport  # noqa: F401`;
`transport_env` (import it with `transport`) gives the same two as environment variables, for
daemon processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

import pytest

BROKER = "amqp://guest:guest@127.0.0.1:5672/"


def broker_up() -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", 5672)) == 0


# The broker is one per machine: a test that stops it (`exclusive`) must not do so under a test
# of another pytest worker or run that uses it. Every user holds BROKER_LOCK shared while its
# prefix lives; the stopper holds it exclusively. The stopper first takes the turnstile, which
# new users pass through, so a stream of users cannot keep it waiting.
BROKER_LOCK = Path(tempfile.gettempdir()) / "dispatcher-tests-rabbitmq.lock"
TURNSTILE = BROKER_LOCK.with_suffix(".turnstile")
BROKER_LOCK_WAIT_S = 90.0


async def flock(file: IO[str], mode: int, deadline: float, why: str) -> None:
    """flock without blocking the event loop (it has no async form): try, then poll."""
    while True:
        try:
            fcntl.flock(file, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail(f"waited {BROKER_LOCK_WAIT_S:.0f} s for {file.name}: {why}")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def broker_lock(exclusive: bool) -> AsyncIterator[None]:
    """Hold the machine's broker lock (shared, or `exclusive` for a test that stops it)."""
    deadline = time.monotonic() + BROKER_LOCK_WAIT_S
    with open(TURNSTILE, "a+") as turnstile, open(BROKER_LOCK, "a+") as lock:  # noqa: ASYNC230
        if exclusive:
            await flock(turnstile, fcntl.LOCK_EX, deadline, "another test waits to stop the broker")
            await flock(lock, fcntl.LOCK_EX, deadline, "other tests still use the broker")
        else:
            await flock(turnstile, fcntl.LOCK_SH, deadline, "another test stops the broker")
            await flock(lock, fcntl.LOCK_SH, deadline, "another test stops the broker")
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@contextlib.asynccontextmanager
async def broker_prefix(exclusive: bool = False) -> AsyncIterator[str]:
    """A queue prefix of its own on the broker (skipped, saying why, when none answers); its
    default queue is deleted afterwards. `exclusive`: no other test uses the broker meanwhile
    (for a test that stops it)."""
    if not broker_up():
        pytest.skip("the rabbitmq variant needs a RabbitMQ broker on 127.0.0.1:5672 (guest/guest)")
    async with broker_lock(exclusive):
        prefix = f"t{uuid.uuid4().hex[:10]}."
        yield prefix
        import aio_pika

        connection = await aio_pika.connect(BROKER)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(prefix + "default")


# the rabbitmq variant carries the `rabbitmq` marker: it runs when asked (tests/suite.py)
@pytest.fixture(params=["in-process", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    if request.param == "in-process":
        yield {}
        return
    async with broker_prefix() as prefix:
        yield {"transport": "rabbitmq", "rabbitmq": {"url": BROKER, "queue_prefix": prefix}}


@pytest.fixture
def transport_env(transport: dict[str, Any]) -> dict[str, str]:
    """The same two transports for daemon processes: `transport` as environment variables."""
    if not transport:
        return {}
    rabbitmq = transport["rabbitmq"]
    return {
        "DISPATCHER_TRANSPORT": transport["transport"],
        "DISPATCHER_RABBITMQ__URL": rabbitmq["url"],
        "DISPATCHER_RABBITMQ__QUEUE_PREFIX": rabbitmq["queue_prefix"],
    }
