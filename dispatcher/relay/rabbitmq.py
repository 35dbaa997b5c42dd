"""The RabbitMQ transport: an outbox relay that publishes ready jobs, and consumers that lease
what they receive. The database stays the authority on attempts, backoff and dead letters; the
broker only carries "job J is ready after attempt A".

- `RabbitLink` owns the connection: it connects (retrying with backoff while the broker is down,
  so the daemon starts and intake and the due-scan keep working), declares one durable quorum
  queue per dispatcher queue (idempotent), consumes them, and reconnects and re-declares when the
  broker closes the connection. `problem` names what is degraded, for /readyz.
- `OutboxRelay` leases a batch of outbox rows (SKIP LOCKED: any number of daemons relay side by
  side), publishes each (persistent, message_id = job key, job id and attempt in the headers),
  waits for the broker's confirms, then deletes the rows. A crash or broker failure in between
  publishes them again later; the consumer's claim makes that harmless.
- `RabbitTransport` hands the claim loop what was delivered: it leases the jobs in the database
  (fenced by the attempt, within the queue's global limits), acks deliveries for jobs that are
  no longer ready for that attempt as counted duplicates, and acks a started job's delivery
  only once its attempt has ended (its outcome committed). Prefetch is the queue's in-flight
  cap: a daemon holds no more deliveries than it could run at once. A delivery for a handler
  version this daemon cannot run (a mixed-version fleet during a rolling release) is never
  started here: the claim refuses it, writing the job a new outbox row that the relay publishes
  again after a second (to any daemon), and the delivery is acked. A requeue would not do: the
  broker hands a requeued message straight back to the same consumer, and a queue with a
  delivery limit would drop it; the database, not the broker, keeps the job ready.
- The drain (SIGTERM) cancels each queue's consumer as its claim loop stops and returns every
  delivery held but not started (nack, requeue) at once; running attempts' deliveries are acked
  on the still-open channel when their outcomes commit.

Only this module imports aio_pika.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)

from dispatcher import metrics
from dispatcher.db.jobs import JobRepository
from dispatcher.lifecycle import LoopService
from dispatcher.model import AttemptKey
from dispatcher.relay.transport import Delivery

log = logging.getLogger(__name__)

RECONNECT_FIRST_S = 0.2
RELAY_IDLE_S = 0.05  # the outbox had nothing: look again soon (one index probe)
CONFIRM_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 5.0  # acknowledgements after the drain; an unacked one is a duplicate later


class RabbitLink(LoopService):
    """The broker connection, its topology and its consumers; reconnects forever."""

    name = "rabbitmq"

    def __init__(self, url: str, prefix: str, prefetch: dict[str, int], *, reconnect_max_s: float):
        self._url = url
        self._prefix = prefix
        self._prefetch = prefetch
        self._reconnect_max_s = reconnect_max_s
        self.connected = asyncio.Event()
        self.problem: str | None = "connecting to RabbitMQ"
        self.publisher: AbstractChannel | None = None
        self.inbox: dict[str, deque[AbstractIncomingMessage]] = {q: deque() for q in prefetch}
        self.arrived: dict[str, asyncio.Event] = {q: asyncio.Event() for q in prefetch}
        self._connection: AbstractConnection | None = None
        # the drain stopped these queues: no consumer for them, and a late delivery goes back
        self._stopped: set[str] = set()
        self._consumers: dict[str, tuple[AbstractQueue, str]] = {}

    def queue_name(self, queue: str) -> str:
        return self._prefix + queue

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
            self.publisher = await connection.channel(publisher_confirms=True)
            for queue, prefetch in self._prefetch.items():
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=prefetch)
                declared = await channel.declare_queue(
                    self.queue_name(queue), durable=True, arguments={"x-queue-type": "quorum"}
                )
                if queue not in self._stopped:
                    tag = await declared.consume(self._receiver(queue), no_ack=False)
                    self._consumers[queue] = (declared, tag)
            self.problem = None
            self.connected.set()
            log.info("connected to RabbitMQ; %d queues declared", len(self._prefetch))
            await closed.wait()
            raise ConnectionError("the broker closed the connection")
        finally:
            with contextlib.suppress(Exception):
                await connection.close()

    def _receiver(self, queue: str) -> Any:
        async def on_message(message: AbstractIncomingMessage) -> None:
            if queue in self._stopped:  # sent before the broker saw the cancel
                await _return(message)
                return
            self.inbox[queue].append(message)
            self.arrived[queue].set()

        return on_message

    async def stop_consuming(self, queue: str) -> None:
        """The drain began: cancel `queue`'s consumer, so the broker sends nothing more here,
        and return every delivery held but not started (nack with requeue: another daemon gets
        it now, not after this drain). The channel stays open: the deliveries of attempts
        still running are acknowledged on it once their outcomes commit."""
        self._stopped.add(queue)
        consumer = self._consumers.pop(queue, None)
        if consumer is not None:
            declared, tag = consumer
            with contextlib.suppress(Exception):  # a closed channel returned them already
                await declared.cancel(tag)
        waiting = self.inbox[queue]
        while waiting:
            await _return(waiting.popleft())
        self.arrived[queue].set()  # a receive waiting for deliveries returns now

    def receiving(self, queue: str) -> bool:
        return queue not in self._stopped

    def _lost(self) -> None:
        """Deliveries of a closed channel return to the broker; forget them here."""
        self.connected.clear()
        self.publisher = None
        self._consumers.clear()
        for waiting in self.inbox.values():
            waiting.clear()

    async def stop(self) -> None:
        await super().stop()
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()


class OutboxRelay(LoopService):
    """Publishes outbox rows to RabbitMQ and deletes them once the broker confirmed them."""

    name = "outbox-relay"

    def __init__(self, repo: JobRepository, link: RabbitLink, *, batch: int, lease_s: float):
        self._repo = repo
        self._link = link
        self._batch = batch
        self._lease_s = lease_s

    async def _run(self) -> None:
        while True:
            await self._link.connected.wait()
            try:
                published = await self.run_once()
            except Exception as exc:  # broker or database: the leased rows go out again later
                metrics.BROKER_FAILURES.inc()
                log.error("relay round failed: %s", exc)
                await asyncio.sleep(RECONNECT_FIRST_S)
                continue
            if published < self._batch:
                await asyncio.sleep(RELAY_IDLE_S)

    async def run_once(self) -> int:
        channel = self._link.publisher
        if channel is None:
            return 0
        rows = await self._repo.lease_outbox(self._batch, self._lease_s)
        if not rows:
            metrics.OUTBOX_LAG.set(0.0)
            return 0
        leased_at = time.monotonic()
        exchange = channel.default_exchange
        async with asyncio.timeout(CONFIRM_TIMEOUT_S):
            await asyncio.gather(
                *(
                    exchange.publish(_message(r), routing_key=self._link.queue_name(r["queue"]))
                    for r in rows
                )
            )
        # every publish above returned only after its confirm: commit -> confirm
        metrics.OUTBOX_LAG.set(max(r["age_s"] for r in rows) + time.monotonic() - leased_at)
        await self._repo.delete_outbox_rows([r["id"] for r in rows])
        return len(rows)


def _message(row: Any) -> aio_pika.Message:
    return aio_pika.Message(
        json.dumps({"job_id": row["job_id"], "attempt": row["attempt"]}).encode(),
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=row["key"],
        headers={"job_id": row["job_id"], "attempt": row["attempt"], "key": row["key"]},
    )


class RabbitTransport:
    """What the claim loop of each queue receives: deliveries, leased in the database."""

    def __init__(
        self,
        repo: JobRepository,
        link: RabbitLink,
        *,
        owner: str,
        capabilities: list[str],
        lease_s: float,
        wait_s: float,
    ):
        self._repo = repo
        self._link = link
        self._owner = owner
        self._capabilities = capabilities
        self._lease_s = lease_s
        self._wait_s = wait_s
        self._acks: dict[AttemptKey, AbstractIncomingMessage] = {}
        self._acking: set[asyncio.Future[None]] = set()

    async def receive(self, queue: str, limit: int) -> Delivery:
        waiting = self._link.inbox[queue]
        if not waiting:
            arrived = self._link.arrived[queue]
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait_s):
                    await arrived.wait()
        batch = [waiting.popleft() for _ in range(min(limit, len(waiting)))]
        if not batch:  # waited for a delivery already: ask again at once
            return Delivery([], 0, 0.0)
        by_job: dict[int, AbstractIncomingMessage] = {}
        keys: list[AttemptKey] = []
        for message in batch:
            headers = message.headers or {}
            job_id, attempt = int(headers["job_id"]), int(headers["attempt"])  # type: ignore[arg-type]
            if job_id in by_job:  # the same job twice in one batch: one is a duplicate
                await _ack(message)
                continue
            by_job[job_id] = message
            keys.append((job_id, attempt))
        try:
            jobs, eligible, refused, wait_s = await self._repo.claim_delivered(
                queue, keys, self._capabilities, self._owner, self._lease_s
            )
        except Exception:
            if self._link.receiving(queue):
                waiting.extendleft(reversed([by_job[k[0]] for k in keys]))
            else:
                for job_id, _ in keys:
                    await _return(by_job[job_id])
            raise
        claimed = {job.id for job in jobs}
        held = [by_job[k[0]] for k in keys if k[0] in eligible and k[0] not in claimed]
        duplicates = 0
        for job_id, message in by_job.items():
            if job_id not in eligible:  # done, another attempt's, or refused: not run here
                duplicates += job_id not in refused
                await _ack(message)
        if refused:  # the claim wrote them new outbox rows: they go out again to any daemon
            metrics.DELIVERIES_REFUSED.labels(queue).inc(len(refused))
        for job in jobs:
            self._acks[(job.id, job.attempt)] = by_job[job.id]
        if self._link.receiving(queue):
            waiting.extendleft(reversed(held))  # the limits held them back: first next time
        else:  # the drain began during the claim: they go back to the broker too
            for message in held:
                await _return(message)
        return Delivery(jobs, len(jobs) + duplicates, wait_s if held else None)

    def finished(self, key: AttemptKey) -> None:
        """The attempt ended (its outcome committed, or left to its lease): ack its delivery."""
        message = self._acks.pop(key, None)
        if message is not None:
            task = asyncio.ensure_future(_ack(message))
            self._acking.add(task)  # held until done, so the task is not collected early
            task.add_done_callback(self._acking.discard)

    async def stop_receiving(self, queue: str) -> None:
        await self._link.stop_consuming(queue)

    async def settle(self) -> None:
        if self._acking:
            await asyncio.wait(set(self._acking), timeout=SETTLE_TIMEOUT_S)


async def _ack(message: AbstractIncomingMessage) -> None:
    # a delivery of a closed channel cannot be acked: the broker redelivers it, and the claim
    # finds the job no longer ready for that attempt (a counted duplicate)
    with contextlib.suppress(Exception):
        await message.ack()


async def _return(message: AbstractIncomingMessage) -> None:
    # requeued at once for any other consumer; if the channel is gone, the broker did it already
    with contextlib.suppress(Exception):
        await message.nack(requeue=True)
