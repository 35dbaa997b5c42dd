"""`RabbitLink`: the broker connection, one durable quorum queue per dispatcher queue, their
consumers and what they delivered; reconnects forever."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import struct
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, cast

import aio_pika
from aio_pika.abc import AbstractConnection
from aiormq import Channel
from aiormq.abc import AbstractChannel, DeliveredMessage

from dispatcher.observability import metrics
from dispatcher.relay.rabbitmq.acks import Acks, Received
from dispatcher.relay.rabbitmq.messages import carried, jobs_per_message
from dispatcher.runtime.lifecycle import LoopService

log = logging.getLogger(__name__)

RECONNECT_FIRST_S = 0.2
RELEASE_MARGIN_S = 0.005  # a refused row's release after its lease ran out (release_after)

Consumer = Callable[[DeliveredMessage], Coroutine[Any, Any, None]]


class RabbitLink(LoopService):
    """The broker connection, its topology and its consumers; reconnects forever."""

    name = "rabbitmq"

    def __init__(
        self,
        url: str,
        prefix: str,
        prefetch: dict[str, int],
        *,
        reconnect_max_s: float,
        jobs_per_message: int = 1,
    ):
        self._url = url
        self._prefix = prefix
        # per queue: its max_inflight, the messages a consumer may hold unacknowledged whatever
        # they carry (messages.py says why)
        self.prefetch = prefetch
        self.jobs_cap = jobs_per_message  # rabbitmq.jobs_per_message
        self._reconnect_max_s = reconnect_max_s
        self.connected = asyncio.Event()
        self.problem: str | None = "connecting to RabbitMQ"
        self.publisher: Channel | None = None  # aiormq's: its publish can skip the drain wait
        self.inbox: dict[str, deque[Received]] = {q: deque() for q in prefetch}
        self.arrived: dict[str, asyncio.Event] = {q: asyncio.Event() for q in prefetch}
        # a claim consumed published rows: a relay waiting on a full window may go on
        self.claimed = asyncio.Event()
        # monotonic times when refused deliveries' rows (written leased until they are due
        # again) can be released, earliest first: the relay releases then, not on a timer
        self._release_dues: list[float] = []
        self._connection: AbstractConnection | None = None
        # the drain stopped these queues: no consumer for them, and a late delivery goes back
        self._stopped: set[str] = set()
        self._consumers: dict[str, tuple[AbstractChannel, str]] = {}
        self._receivers: dict[str, Consumer] = {}  # per queue, for a consumer started again
        self._acks: list[Acks] = []

    def release_after(self, delays_s: Iterable[float]) -> None:
        """A claim wrote refused deliveries' rows whose leases run out in `delays_s` seconds:
        have the relay release them then (a little later: the lease counts on the database
        clock, from the claim's start)."""
        now = time.monotonic()
        for delay in delays_s:
            heapq.heappush(self._release_dues, now + delay + RELEASE_MARGIN_S)
        self.claimed.set()

    def release_due(self) -> float:
        """The monotonic time of the earliest release `release_after` asked for (inf: none)."""
        return self._release_dues[0] if self._release_dues else math.inf

    def released(self, now: float) -> None:
        """The relay released the rows due by monotonic time `now`."""
        while self._release_dues and self._release_dues[0] <= now:
            heapq.heappop(self._release_dues)

    def queue_name(self, queue: str) -> str:
        return self._prefix + queue

    def jobs_per_message(self, queue: str) -> int:
        """The jobs one message of `queue` carries at most (messages.py)."""
        return jobs_per_message(self.prefetch[queue], self.jobs_cap)

    async def _run(self) -> None:
        delay = RECONNECT_FIRST_S
        while True:
            try:
                await self._session()
                delay = RECONNECT_FIRST_S
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.problem = f"RabbitMQ unreachable ({type(exc).__name__}: {exc})"
                metrics.BROKER_FAILURES.inc()
                log.error("%s; retrying in %.1f s", self.problem, delay)
            self._lost()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._reconnect_max_s)

    async def _session(self) -> None:
        """One connection's life: declare, consume, and return when the broker closes it."""
        # named after the queue prefix, so an operator (or a test) can tell whose it is
        connection = await aio_pika.connect(
            self._url,
            timeout=10,
            client_properties={"connection_name": f"dispatcher {self._prefix}"},
        )
        self._connection = connection
        closed = asyncio.Event()
        connection.close_callbacks.add(lambda *_: closed.set())
        try:
            publisher = await connection.channel(publisher_confirms=True)
            self.publisher = cast(Channel, await publisher.get_underlay_channel())
            for queue in self.prefetch:
                channel = await connection.channel(publisher_confirms=False)
                await channel.set_qos(prefetch_count=self.prefetch[queue])
                await channel.declare_queue(
                    self.queue_name(queue), durable=True, arguments={"x-queue-type": "quorum"}
                )
                raw = await channel.get_underlay_channel()
                acks = Acks(raw)
                self._acks.append(acks)
                self._receivers[queue] = self._receiver(queue, acks)
                if queue not in self._stopped:
                    ok = await raw.basic_consume(
                        self.queue_name(queue), self._receivers[queue], no_ack=False
                    )
                    assert ok.consumer_tag is not None
                    self._consumers[queue] = (raw, ok.consumer_tag)
            self.problem = None
            self.connected.set()
            log.info("connected to RabbitMQ; %d queues declared", len(self.prefetch))
            await closed.wait()
            raise ConnectionError("the broker closed the connection")
        finally:
            with contextlib.suppress(Exception):
                await connection.close()

    def _receiver(self, queue: str, acks: Acks) -> Consumer:
        inbox, arrived = self.inbox[queue], self.arrived[queue]

        async def on_message(message: DeliveredMessage) -> None:
            tag: int = message.delivery.delivery_tag  # type: ignore[union-attr, assignment]
            if queue in self._stopped:  # sent before the broker saw the cancel
                acks.received(tag)
                acks.give_back(tag)
                return
            props = message.header.properties
            try:
                jobs, record = carried(props.content_type, props.headers, message.body)
            except (KeyError, TypeError, ValueError, struct.error):  # never runnable
                log.error("dropped a message that names no job and attempt from %s", queue)
                acks.received(tag)
                acks.ack(tag)
                return
            acks.received(tag, len(jobs))
            inbox.extend([Received(acks, tag, job_id, attempt, record) for job_id, attempt in jobs])
            arrived.set()

        return on_message

    async def set_prefetch(self, queue: str, prefetch: int) -> None:
        """Queue `queue`'s max_inflight changed at run time: the broker may hand this daemon
        that many unacknowledged messages (messages.py: a daemon runs at most max_inflight jobs
        whatever its messages carry). A consumer's prefetch is fixed when it starts, so the
        consumer starts again on the same channel (deliveries held stay held and are
        acknowledged there); a later connection uses the new value from the start."""
        if self.prefetch.get(queue) == prefetch:
            return
        self.prefetch[queue] = prefetch
        consumer = self._consumers.get(queue)
        if consumer is None or queue in self._stopped:
            return
        channel, tag = consumer
        try:
            await channel.basic_cancel(tag)
            await channel.basic_qos(prefetch_count=prefetch)
            ok = await channel.basic_consume(
                self.queue_name(queue), self._receivers[queue], no_ack=False
            )
        except Exception as exc:  # the connection is going: the next one declares it anew
            log.warning("queue %s: prefetch not changed on this connection: %s", queue, exc)
            return
        assert ok.consumer_tag is not None
        if queue in self._stopped:  # the drain began meanwhile: no consumer after all
            with contextlib.suppress(Exception):
                await channel.basic_cancel(ok.consumer_tag)
            return
        self._consumers[queue] = (channel, ok.consumer_tag)

    async def stop_consuming(self, queue: str) -> None:
        """The drain began: cancel `queue`'s consumer, so the broker sends nothing more here,
        and return every delivery held but not started (nack with requeue: another daemon gets
        it now, not after this drain). The channel stays open: the deliveries of attempts
        still running are acknowledged on it once their outcomes commit."""
        self._stopped.add(queue)
        consumer = self._consumers.pop(queue, None)
        if consumer is not None:
            channel, tag = consumer
            with contextlib.suppress(Exception):  # a closed channel returned them already
                await channel.basic_cancel(tag)
        waiting = self.inbox[queue]
        returned = {id(r.acks): r.acks for r in waiting}
        while waiting:
            held = waiting.popleft()
            held.acks.give_back(held.tag)
        self.arrived[queue].set()  # a receive waiting for deliveries returns now
        for acks in returned.values():
            await acks.settled()

    async def reconnect(self) -> None:
        """Close the connection: the link connects again and declares every queue anew."""
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()

    def receiving(self, queue: str) -> bool:
        return queue not in self._stopped

    async def settle(self, timeout_s: float) -> None:
        """Wait (bounded) until the acknowledgements and returns so far have been written."""
        pending = [asyncio.ensure_future(a.settled()) for a in self._acks]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    def _lost(self) -> None:
        """Deliveries of a closed channel return to the broker; forget them here."""
        self.connected.clear()
        self.publisher = None
        self._consumers.clear()
        self._acks.clear()
        for waiting in self.inbox.values():
            waiting.clear()

    async def stop(self) -> None:
        await super().stop()
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
