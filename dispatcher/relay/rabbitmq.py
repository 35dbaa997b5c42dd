"""The RabbitMQ transport: an outbox relay that publishes ready jobs, and consumers that lease
what they receive. The database stays the authority on attempts, backoff and dead letters; the
broker only carries "job J is ready after attempt A".

- `RabbitLink` owns the connection: it connects (retrying with backoff while the broker is down,
  so the daemon starts and intake and the due-scan keep working), declares one durable quorum
  queue per dispatcher queue (idempotent), consumes them, and reconnects and re-declares when the
  broker closes the connection. `problem` names what is degraded, for /readyz.
- `OutboxRelay` leases a batch of outbox rows (SKIP LOCKED: any number of daemons relay side by
  side), publishes them all at once (persistent, message_id = job key, job id and attempt in the
  headers), awaits their confirms together, then marks the rows published. A crash or broker
  failure in between publishes them again later; the consumer's claim makes that harmless.
  The row stays until a consumer's claim starts its job, so the published rows of a queue are
  its messages not yet claimed: the relay keeps at most a window of them (`publish_ahead` x the
  queue's max_inflight, all daemons together) and picks what to publish fairly across tenants,
  so a tenant's burst waits in the database, not in the broker ahead of another tenant's job.
  Its sweep publishes again the rows published longer ago than `republish_after_s` whose jobs
  are still ready: messages lost in the broker (a purged queue, lost broker data). If such a
  message was only slow, one of its two deliveries is a counted duplicate.
- `RabbitTransport` hands the claim loop what was delivered: it leases the jobs in the database
  in batches (fenced by the attempt, within the queue's global limits), acks deliveries for jobs
  that are no longer ready for that attempt as counted duplicates, and acks a started job's
  delivery only once its attempt has ended (its outcome committed). Prefetch is the queue's
  in-flight cap: a daemon holds no more deliveries than it could run at once. A delivery for a
  handler version this daemon cannot run (a mixed-version fleet during a rolling release) is
  never started here: the claim refuses it, writing the job a new outbox row that the relay
  publishes again after a second (to any daemon), and the delivery is acked. A requeue would
  not do: the broker hands a requeued message straight back to the same consumer, and a queue
  with a delivery limit would drop it; the database, not the broker, keeps the job ready.
- The drain (SIGTERM) cancels each queue's consumer as its claim loop stops and returns every
  delivery held but not started (nack, requeue) at once; running attempts' deliveries are acked
  on the still-open channel when their outcomes commit.

Everything per message is kept small, because the per-message cost is the transport's cost
(measured with bench_scaleout, one daemon, 5,000 no-op jobs: aio-pika's Message objects and one
consumer task more per delivery cost ~360 us of daemon CPU per job before this module used the
underlying aiormq channel, which aio-pika exposes, for publishing, consuming and acknowledging).

Only this module imports aio_pika and aiormq.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import aio_pika
from aio_pika.abc import AbstractConnection
from aiormq import Channel
from aiormq.abc import AbstractChannel, ChannelFrame, DeliveredMessage
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from dispatcher.db.claims import ClaimConnections
from dispatcher.db.relay import OutboxLease, RelayRepository
from dispatcher.model import AttemptKey, ByteGrant
from dispatcher.observability import metrics
from dispatcher.relay.transport import Delivery
from dispatcher.runtime.lifecycle import LoopService

log = logging.getLogger(__name__)

RECONNECT_FIRST_S = 0.2
RELAY_IDLE_S = 0.05  # nothing to publish (or the windows are full): look again soon
CONFIRM_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 5.0  # acknowledgements after the drain; an unacked one is a duplicate later
# A claim waits this long for more deliveries when fewer arrived than it could start: the
# broker sends a published batch as a stream, and one claim statement per few deliveries cost
# more than the wait (bench_scaleout, 5,000 jobs: 450 claims of ~11 deliveries each before).
GATHER_S = 0.002
# Acknowledgements wait this long to leave together: a completion batch ends many attempts at
# once, and their deliveries then go in one `multiple` ack.
ACK_DELAY_S = 0.002
SWEEP_EVERY_MIN_S, SWEEP_EVERY_MAX_S = 1.0, 60.0
# Batches published and awaiting their confirms at once. A quorum queue confirms a batch of 500
# only once a majority wrote it (130-290 ms here); waiting for that before leasing the next
# batch capped the relay at ~2,000 messages/s.
ROUNDS_IN_FLIGHT = 4

Consumer = Callable[[DeliveredMessage], Coroutine[Any, Any, None]]


Message = tuple[str, bytes, Basic.Properties]  # routing key (the queue), body, properties

# What publish_batch uses of aiormq's Channel: the state its basic_publish keeps per message.
_PUBLISH_STATE = (
    "lock",
    "delivery_tag",
    "confirmations",
    "message_id_delivery_tag",
    "write_queue",
    "number",
    "create_future",
    "max_content_size",
    "publisher_confirms",
)


def batch_publishing(channel: Channel) -> bool:
    """Whether `publish_batch` can write a batch at once on this aiormq version."""
    return all(hasattr(channel, name) for name in _PUBLISH_STATE) and bool(
        channel.publisher_confirms
    )


async def publish_batch(channel: Channel, messages: list[Message]) -> list[asyncio.Future[Any]]:
    """Publish `messages` (mandatory: an unroutable one comes back, unconfirmed) and return
    their confirmations, to be awaited together.

    aiormq's basic_publish costs ~250 us of CPU per message (a coroutine, a lock, a marshal and
    a socket write each; measured on this machine, 5,000 messages to a local broker); here a
    batch is marshalled into one frame buffer and written at once: ~50 us per message, and
    ~9,800 confirmed messages/s instead of ~2,600. It does, for the whole batch under the
    channel's lock, what basic_publish does for one message: number the publishes, register
    their confirmations (and message ids, which route a broker's return to its confirmation),
    and queue the frames; if queueing fails, nothing was sent and the numbering is rolled back.
    On an aiormq without that state, each message goes through basic_publish instead."""
    if not batch_publishing(channel) or any(
        len(body) >= channel.max_content_size for _, body, _ in messages
    ):
        return [
            asyncio.ensure_future(
                channel.basic_publish(
                    body, routing_key=key, properties=props, mandatory=True, wait=False
                )
            )
            for key, body, props in messages
        ]
    confirms: list[asyncio.Future[Any]] = []
    frames: list[Any] = []
    async with channel.lock:
        first = channel.delivery_tag + 1
        for key, body, props in messages:
            channel.delivery_tag += 1
            tag = channel.delivery_tag
            confirm = channel.create_future()
            channel.confirmations[tag] = confirm
            message_id = str(props.message_id)
            channel.message_id_delivery_tag[message_id] = tag
            confirm.add_done_callback(functools.partial(_forget_id, channel, message_id, tag))
            confirms.append(confirm)
            frames += (
                Basic.Publish(exchange="", routing_key=key, mandatory=True),
                ContentHeader(properties=props, body_size=len(body)),
            )
            if body:
                frames.append(ContentBody(body))
        try:
            await channel.write_queue.put(
                ChannelFrame.marshall(channel_number=channel.number, frames=frames)
            )
        except BaseException:  # not queued, so never sent: as if never numbered
            channel.delivery_tag = first - 1
            for tag, confirm in enumerate(confirms, start=first):
                channel.confirmations.pop(tag, None)
                confirm.cancel()
            raise
    return confirms


def _forget_id(channel: Channel, message_id: str, tag: int, _: object) -> None:
    if channel.message_id_delivery_tag.get(message_id) == tag:
        del channel.message_id_delivery_tag[message_id]


class _Acks:
    """The acknowledgements of one consumer channel, sent in order and in batches.

    Delivery tags rise on a channel. A tag is open from its delivery until it is settled: acked
    (its attempt ended, or it was a duplicate) or returned (nack, requeue). The settled tags at
    the front of the open ones leave as one `multiple` ack; a settled tag behind an open one (a
    long attempt) is acked alone, so it does not hold a prefetch slot. One flusher at a time
    writes, returns first, so a `multiple` ack never reaches the broker before a return or a
    single ack of a tag it covers (the broker would ack the returned message, or close the
    channel over an unknown tag)."""

    def __init__(self, channel: AbstractChannel):
        self.channel = channel
        self._open: deque[int] = deque()
        self._settled: dict[int, bool] = {}  # settled tags still open here -> already sent
        self._to_ack: list[int] = []
        self._to_return: list[int] = []
        self._flushing: asyncio.Future[None] | None = None

    def received(self, tag: int) -> None:
        self._open.append(tag)

    def ack(self, tag: int) -> None:
        self._to_ack.append(tag)
        self._schedule()

    def give_back(self, tag: int) -> None:
        self._to_return.append(tag)
        self._schedule()

    def _schedule(self) -> None:
        if self._flushing is None:
            self._flushing = asyncio.ensure_future(self._flush())

    async def settled(self) -> None:
        """Wait until what was acked or returned so far has been written."""
        if self._flushing is not None:
            await asyncio.shield(self._flushing)

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(ACK_DELAY_S)
            while self._to_ack or self._to_return:
                await self._write_one_round()
        except Exception:  # the channel closed: the broker redelivers what it had not seen
            self._open.clear()
            self._settled.clear()
            self._to_ack.clear()
            self._to_return.clear()
        finally:
            self._flushing = None  # no await since the loop's last check: nothing is left behind

    async def _write_one_round(self) -> None:
        returns, self._to_return = self._to_return, []
        acks, self._to_ack = self._to_ack, []
        for tag in returns:
            self._settled[tag] = True
        for tag in acks:
            self._settled[tag] = False
        # the `multiple` ack names the last unsent tag of the settled front: the broker walks
        # its unacked tags up to that very one (a tag it no longer holds, returned or acked
        # alone, would be an unknown tag to it: a channel error)
        last_unsent = 0
        while self._open and self._open[0] in self._settled:
            tag = self._open.popleft()
            if not self._settled.pop(tag):
                last_unsent = tag
        singles = [tag for tag in acks if tag in self._settled]
        for tag in singles:
            self._settled[tag] = True
        channel = self.channel
        sends: list[Callable[..., Awaitable[None]]] = [
            *(functools.partial(channel.basic_nack, tag, requeue=True) for tag in returns),
            *(
                [functools.partial(channel.basic_ack, last_unsent, multiple=True)]
                * bool(last_unsent)
            ),
            *(functools.partial(channel.basic_ack, tag) for tag in singles),
        ]
        # one after another on the connection's queue; the last waits until it (so all) left
        # for the socket, so `settled` means written (the connection may close right after)
        for send in sends[:-1]:
            await send(wait=False)
        if sends:
            await sends[-1](wait=True)


class _Received:
    """One delivery held by this process: where to acknowledge it, and what it carries."""

    __slots__ = ("acks", "attempt", "job_id", "tag")

    def __init__(self, acks: _Acks, tag: int, job_id: int, attempt: int):
        self.acks = acks
        self.tag = tag
        self.job_id = job_id
        self.attempt = attempt


class RabbitLink(LoopService):
    """The broker connection, its topology and its consumers; reconnects forever."""

    name = "rabbitmq"

    def __init__(self, url: str, prefix: str, prefetch: dict[str, int], *, reconnect_max_s: float):
        self._url = url
        self._prefix = prefix
        self.prefetch = prefetch  # per queue: its max_inflight
        self._reconnect_max_s = reconnect_max_s
        self.connected = asyncio.Event()
        self.problem: str | None = "connecting to RabbitMQ"
        self.publisher: Channel | None = None  # aiormq's: its publish can skip the drain wait
        self.inbox: dict[str, deque[_Received]] = {q: deque() for q in prefetch}
        self.arrived: dict[str, asyncio.Event] = {q: asyncio.Event() for q in prefetch}
        # a claim consumed published rows: a relay waiting on a full window may go on
        self.claimed = asyncio.Event()
        self._connection: AbstractConnection | None = None
        # the drain stopped these queues: no consumer for them, and a late delivery goes back
        self._stopped: set[str] = set()
        self._consumers: dict[str, tuple[AbstractChannel, str]] = {}
        self._acks: list[_Acks] = []

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
            publisher = await connection.channel(publisher_confirms=True)
            self.publisher = cast(Channel, await publisher.get_underlay_channel())
            for queue, prefetch in self.prefetch.items():
                channel = await connection.channel(publisher_confirms=False)
                await channel.set_qos(prefetch_count=prefetch)
                await channel.declare_queue(
                    self.queue_name(queue), durable=True, arguments={"x-queue-type": "quorum"}
                )
                raw = await channel.get_underlay_channel()
                acks = _Acks(raw)
                self._acks.append(acks)
                if queue not in self._stopped:
                    ok = await raw.basic_consume(
                        self.queue_name(queue), self._receiver(queue, acks), no_ack=False
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

    def _receiver(self, queue: str, acks: _Acks) -> Consumer:
        inbox, arrived = self.inbox[queue], self.arrived[queue]

        async def on_message(message: DeliveredMessage) -> None:
            tag: int = message.delivery.delivery_tag  # type: ignore[union-attr, assignment]
            acks.received(tag)
            if queue in self._stopped:  # sent before the broker saw the cancel
                acks.give_back(tag)
                return
            try:
                headers = message.header.properties.headers or {}
                job_id, attempt = int(headers["job_id"]), int(headers["attempt"])  # type: ignore[arg-type]
            except (KeyError, TypeError, ValueError):  # not a relay's message: never runnable
                log.error("dropped a message without job_id and attempt headers from %s", queue)
                acks.ack(tag)
                return
            inbox.append(_Received(acks, tag, job_id, attempt))
            arrived.set()

        return on_message

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


class OutboxRelay(LoopService):
    """Publishes outbox rows to RabbitMQ, at most a window per queue ahead of the consumers,
    and marks them published once the broker confirmed them; its sweep publishes again what the
    broker lost."""

    name = "outbox-relay"

    def __init__(
        self,
        repo: RelayRepository,
        link: RabbitLink,
        *,
        batch: int,
        lease_s: float,
        publish_ahead: float,
        republish_after_s: float,
    ):
        self._repo = repo
        self._link = link
        self._batch = batch
        self._lease_s = lease_s
        self.windows = {q: math.ceil(publish_ahead * n) for q, n in link.prefetch.items()}
        self._republish_after_s = republish_after_s
        self._sweep_every_s = min(max(republish_after_s / 4, SWEEP_EVERY_MIN_S), SWEEP_EVERY_MAX_S)

    async def _run(self) -> None:
        sweep_at = time.monotonic() + self._sweep_every_s
        rounds: set[asyncio.Task[None]] = set()  # published, awaiting their confirms
        try:
            while True:
                await self._link.connected.wait()
                self._link.claimed.clear()
                try:
                    while len(rounds) >= ROUNDS_IN_FLIGHT:
                        await asyncio.wait(rounds, return_when=asyncio.FIRST_COMPLETED)
                    leased = await self._publish_next(rounds)
                    if time.monotonic() >= sweep_at:
                        await self.sweep_once()
                        sweep_at = time.monotonic() + self._sweep_every_s
                except Exception as exc:  # broker or database: leased rows go out again later
                    _failed(exc)
                    await asyncio.sleep(RECONNECT_FIRST_S)
                    continue
                if leased == 0:  # nothing new, or the windows are full: until a claim, or soon
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(RELAY_IDLE_S):
                            await self._link.claimed.wait()
        finally:
            for task in rounds:  # their rows stay leased: published again once it expires
                task.cancel()

    async def run_once(self) -> int:
        """One round: lease, publish, await the confirms, mark; return how many were leased."""
        rounds: set[asyncio.Task[None]] = set()
        leased = await self._publish_next(rounds)
        for task in rounds:
            await task
        return leased

    async def _publish_next(self, rounds: set[asyncio.Task[None]]) -> int:
        """Lease a batch and publish it at once; its confirms are awaited by a task added to
        `rounds` (the next batch need not wait for them). Return how many rows were leased."""
        channel = self._link.publisher
        if channel is None:
            return 0
        rows = await self._repo.lease_outbox(self.windows, self._batch, self._lease_s)
        if not rows:
            if not rounds:
                metrics.OUTBOX_LAG.set(0.0)
            return 0
        leased_at = time.monotonic()
        messages = [
            (
                self._link.queue_name(row.queue),
                b"",  # all it carries is in its properties: two frames a message, not three
                Basic.Properties(
                    delivery_mode=2,  # persistent
                    message_id=row.key,
                    headers={"job_id": row.job_id, "attempt": row.attempt, "key": row.key},
                ),
            )
            for row in rows
        ]
        confirms = await publish_batch(channel, messages)
        task = asyncio.ensure_future(self._confirmed(rows, confirms, leased_at))
        rounds.add(task)
        task.add_done_callback(rounds.discard)
        task.add_done_callback(_report)
        return len(rows)

    async def _confirmed(
        self, rows: list[OutboxLease], confirms: list[asyncio.Future[Any]], leased_at: float
    ) -> None:
        """Await a published batch's confirms together, then mark the confirmed rows."""
        async with asyncio.timeout(CONFIRM_TIMEOUT_S):
            outcomes = await asyncio.gather(*confirms, return_exceptions=True)
        confirmed = [
            row.id for row, ok in zip(rows, outcomes, strict=True) if isinstance(ok, Basic.Ack)
        ]
        # commit -> confirm
        metrics.OUTBOX_LAG.set(max(r.age_s for r in rows) + time.monotonic() - leased_at)
        if confirmed:
            await self._repo.mark_published(confirmed)
        if len(confirmed) < len(rows):  # published again once their lease expires
            failure = next(o for o in outcomes if not isinstance(o, Basic.Ack))
            if isinstance(failure, DeliveredMessage):  # returned: a queue was deleted
                await self._link.reconnect()  # which declares it again
            raise RuntimeError(
                f"{len(rows) - len(confirmed)} of {len(rows)} messages not confirmed: {failure!r}"
            )

    async def sweep_once(self) -> int:
        """Have the messages the broker lost published again: passes of at most one batch,
        until a pass finds fewer; return how many rows were unmarked."""
        total = 0
        while True:
            found = await self._repo.sweep_unclaimed(self._republish_after_s, self._batch)
            swept = 0
            for queue, (republished, dropped) in found.items():
                swept += republished + dropped
                total += republished
                if republished:
                    metrics.OUTBOX_REPUBLISHED.labels(queue).inc(republished)
                    log.warning(
                        "%d messages of queue %s published %.0f s ago and never claimed: "
                        "publishing them again (lost in the broker?)",
                        republished,
                        queue,
                        self._republish_after_s,
                    )
                if dropped:
                    log.info("%d left-over outbox rows of queue %s deleted", dropped, queue)
            if swept < self._batch:
                return total


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _failed(task.exception())  # type: ignore[arg-type]


def _failed(exc: BaseException) -> None:
    metrics.BROKER_FAILURES.inc()
    log.error("relay round failed: %s", exc)


class RabbitTransport:
    """What the claim loop of each queue receives: deliveries, leased in the database on the
    daemon's shared claim connections (db/claims.py)."""

    def __init__(
        self,
        claims: ClaimConnections,
        link: RabbitLink,
        *,
        owner: str,
        capabilities: list[str],
        lease_s: float,
        wait_s: float,
    ):
        self._claims = claims
        self._link = link
        self._owner = owner
        self._capabilities = capabilities
        self._lease_s = lease_s
        self._wait_s = wait_s
        self._acks: dict[AttemptKey, _Received] = {}

    async def wait_for_work(self, queue: str, limit: int) -> None:
        """Until a delivery of `queue` waits (at most `wait_s`), then a moment for more of the
        same stream, so one claim takes them all."""
        waiting = self._link.inbox[queue]
        if not waiting:
            arrived = self._link.arrived[queue]
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait_s):
                    await arrived.wait()
        if waiting and len(waiting) < limit and self._link.receiving(queue):
            await asyncio.sleep(GATHER_S)

    async def receive(self, queue: str, limit: int, grant: ByteGrant) -> Delivery:
        waiting = self._link.inbox[queue]
        batch = [waiting.popleft() for _ in range(min(limit, len(waiting)))]
        if not batch:  # waited for a delivery already: ask again at once
            return Delivery([], 0, 0.0)
        by_job: dict[int, _Received] = {}
        duplicates = 0
        for received in batch:
            if received.job_id in by_job:  # the same job twice in one batch: one is a duplicate
                received.acks.ack(received.tag)
                duplicates += 1
            else:
                by_job[received.job_id] = received
        try:
            claimed = await self._claims.claim_delivered(
                queue,
                [(r.job_id, r.attempt) for r in by_job.values()],
                self._capabilities,
                self._owner,
                self._lease_s,
                grant,
            )
        except Exception:
            if self._link.receiving(queue):
                waiting.extendleft(reversed(by_job.values()))
            else:
                for received in by_job.values():
                    received.acks.give_back(received.tag)
            raise
        started = {job.id for job in claimed.jobs}
        held = [r for r in by_job.values() if r.job_id in claimed.eligible - started]
        for job_id, received in by_job.items():
            if job_id not in claimed.eligible:  # done, another attempt's, or refused: not here
                duplicates += job_id not in claimed.refused
                received.acks.ack(received.tag)
        if claimed.refused:  # the claim wrote them new outbox rows: out again to any daemon
            metrics.DELIVERIES_REFUSED.labels(queue).inc(len(claimed.refused))
        for job in claimed.jobs:
            self._acks[(job.id, job.attempt)] = by_job[job.id]
        if len(held) < len(by_job):  # published rows consumed: the relay's window opened
            self._link.claimed.set()
        if self._link.receiving(queue):
            # the limits or the memory budget held them back: first next time
            waiting.extendleft(reversed(held))
        else:  # the drain began during the claim: they go back to the broker too
            for received in held:
                received.acks.give_back(received.tag)
        return Delivery(
            claimed.jobs,
            len(claimed.jobs) + duplicates,
            claimed.wait_s if held else None,
            held_back=bool(held) and claimed.wait_s is None,  # the limits hold with a wait
        )

    async def more_ready(self, queue: str) -> bool:
        return True  # deliveries may be waiting in the broker: receive again at once

    def finished(self, key: AttemptKey) -> None:
        """The attempt ended (its outcome committed, or left to its lease): ack its delivery."""
        received = self._acks.pop(key, None)
        if received is not None:
            received.acks.ack(received.tag)

    async def stop_receiving(self, queue: str) -> None:
        await self._link.stop_consuming(queue)

    async def settle(self) -> None:
        await self._link.settle(SETTLE_TIMEOUT_S)
