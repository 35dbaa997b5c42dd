"""Both transports for the same tests: `transport` is a fixture parametrised over the in-process
transport and RabbitMQ (the broker on 127.0.0.1:5672, guest/guest). It yields settings
overrides for `make_settings`; the rabbitmq variant uses a queue prefix of its own and deletes
its queues afterwards, and is skipped, saying why, when no broker answers.

A module uses it by importing it: `from tests.transports import transport  # noqa: F401`;
`transport_env` (import it with `transport`) gives the same two as environment variables, for
daemon processes.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

BROKER = "amqp://guest:guest@127.0.0.1:5672/"


def broker_up() -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", 5672)) == 0


@contextlib.asynccontextmanager
async def broker_prefix() -> AsyncIterator[str]:
    """A queue prefix of its own on the broker (skipped, saying why, when none answers); its
    default queue is deleted afterwards."""
    if not broker_up():
        pytest.skip("the rabbitmq variant needs a RabbitMQ broker on 127.0.0.1:5672 (guest/guest)")
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
