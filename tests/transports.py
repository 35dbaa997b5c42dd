"""Both transports for the same tests: `transport` is a fixture parametrised over the in-process
transport and RabbitMQ (the broker on 127.0.0.1:5672, guest/guest). It yields settings
overrides for `make_settings`; the rabbitmq variant uses a queue prefix of its own and deletes
its queues afterwards, and is skipped, saying why, when no broker answers.

A module uses it by importing it: `from tests.transports import transport  # noqa: F401`.
"""

from __future__ import annotations

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


@pytest.fixture(params=["in-process", "rabbitmq"])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    if request.param == "in-process":
        yield {}
        return
    if not broker_up():
        pytest.skip("the rabbitmq variant needs a RabbitMQ broker on 127.0.0.1:5672 (guest/guest)")
    prefix = f"t{uuid.uuid4().hex[:10]}."
    yield {"transport": "rabbitmq", "rabbitmq": {"url": BROKER, "queue_prefix": prefix}}
    import aio_pika

    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(prefix + "default")
