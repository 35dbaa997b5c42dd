"""`OutboxRelay`: publishes outbox rows to RabbitMQ within each queue's window, marks them
published once confirmed, and publishes again what the broker lost."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic

from dispatcher.db.relay import OutboxLease, RelayRepository
from dispatcher.observability import metrics
from dispatcher.relay.rabbitmq.link import RECONNECT_FIRST_S, RabbitLink
from dispatcher.relay.rabbitmq.messages import properties
from dispatcher.relay.rabbitmq.publish import publish_batch
from dispatcher.runtime.lifecycle import LoopService

log = logging.getLogger(__name__)

# An idle relay (nothing to publish, or the windows full) waits for a wake-up: new ready work
# (the daemon's wake-ups, a NOTIFY, the work poll finding a ready queue), a claim opening a
# window, a lease it knows of running out. This bounds the wait should every one be lost. Polling
# every 50 ms and releasing every quarter second had cost an idle daemon 24 statements/s.
RELAY_IDLE_S = 30.0
CONFIRM_TIMEOUT_S = 30.0
SWEEP_EVERY_MIN_S, SWEEP_EVERY_MAX_S = 1.0, 60.0
# Rows whose lease ran out unconfirmed go back to the pick (the pick walks only unleased rows)
# when this relay knows one can have: its failed round's rows after their lease, a refused
# delivery's row once it is due again (link.release_after: a second; a concurrency key's next
# token). Another relay's rows (one killed mid-batch) are released at least once a lease time.
# A key's held rows come back sooner when one of its jobs ends or its limits change: the
# database releases them and wakes the relays (30_key_running.sql).
# Batches published and awaiting their confirms at once. A quorum queue confirms a batch of 500
# only once a majority wrote it (130-290 ms here); waiting for that before leasing the next
# batch capped the relay at ~2,000 messages/s.
ROUNDS_IN_FLIGHT = 4


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
        self._publish_ahead = publish_ahead
        self._republish_after_s = republish_after_s
        self._sweep_every_s = min(max(republish_after_s / 4, SWEEP_EVERY_MIN_S), SWEEP_EVERY_MAX_S)
        self._woken = asyncio.Event()
        self._release_at = 0.0  # monotonic: when a lease this relay knows of can have run out

    def set_max_inflight(self, queue: str, max_inflight: int) -> None:
        """A queue's max_inflight changed at run time: publish as far ahead of it as before."""
        if queue in self.windows:
            self.windows[queue] = math.ceil(self._publish_ahead * max_inflight)
            self._woken.set()  # a wider window: an idle relay publishes into it at once

    def wake(self) -> None:
        """Ready work may have new outbox rows: an idle relay leases at once."""
        self._woken.set()

    def _release_later(self) -> None:
        """This relay's rows leased now may stay unconfirmed: release once their lease ran out
        (a little later: the lease counts on the database clock)."""
        self._release_at = min(self._release_at, time.monotonic() + self._lease_s + 0.05)

    async def _run(self) -> None:
        now = time.monotonic()
        sweep_at = now + self._sweep_every_s
        self._release_at = now  # a previous relay's leases, at once
        release_every_at = now + self._lease_s
        rounds: set[asyncio.Task[None]] = set()  # published, awaiting their confirms
        try:
            while True:
                await self._link.connected.wait()
                self._link.claimed.clear()
                self._woken.clear()
                try:
                    while len(rounds) >= ROUNDS_IN_FLIGHT:
                        await asyncio.wait(rounds, return_when=asyncio.FIRST_COMPLETED)
                    now = time.monotonic()
                    release_at = min(self._release_at, self._link.release_due(), release_every_at)
                    if now >= release_at:
                        self._release_at = math.inf
                        self._link.released(now)
                        release_every_at = now + self._lease_s
                        if await self._repo.release_outbox(self._batch) >= self._batch:
                            self._release_at = now  # more: again next round
                    leased = await self._publish_next(rounds)
                    if time.monotonic() >= sweep_at:
                        leased += await self.sweep_once()  # unmarked: to publish at once
                        sweep_at = time.monotonic() + self._sweep_every_s
                except Exception as exc:  # broker or database: leased rows go out again later
                    _failed(exc)
                    self._release_later()
                    await asyncio.sleep(RECONNECT_FIRST_S)
                    continue
                if leased == 0:  # nothing new, or the windows are full: until a wake-up
                    await self._idle(
                        min(self._release_at, self._link.release_due(), sweep_at, release_every_at)
                    )
        finally:
            for task in rounds:  # their rows stay leased: published again once it expires
                task.cancel()

    async def _idle(self, until: float) -> None:
        """Until a wake-up, a claim, or the monotonic time `until` (bounded by RELAY_IDLE_S)."""
        delay = min(max(until - time.monotonic(), 0.0), RELAY_IDLE_S)
        if delay <= 0.0:
            return
        waits = [
            asyncio.ensure_future(self._link.claimed.wait()),
            asyncio.ensure_future(self._woken.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def run_once(self) -> int:
        """One round: release what ran out, lease, publish, await the confirms, mark; return
        how many were leased."""
        await self._repo.release_outbox(self._batch)
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
        batches = self._messages(rows)
        messages = [
            (
                self._link.queue_name(batch[0].queue),
                *properties([(r.job_id, r.attempt, r.key) for r in batch]),
            )
            for batch in batches
        ]
        confirms = await publish_batch(channel, messages)
        task = asyncio.ensure_future(self._confirmed(batches, confirms, leased_at))
        rounds.add(task)
        task.add_done_callback(rounds.discard)
        task.add_done_callback(self._report)
        return len(rows)

    def _messages(self, rows: list[OutboxLease]) -> list[list[OutboxLease]]:
        """The leased rows as messages: per queue, in the order leased (the pick's fair order),
        slices of at most the queue's jobs per message; the messages in the order of their
        first rows."""
        messages: list[list[OutboxLease]] = []
        filling: dict[str, list[OutboxLease]] = {}
        for row in rows:
            batch = filling.get(row.queue)
            if batch is None or len(batch) >= self._link.jobs_per_message(row.queue):
                batch = filling[row.queue] = []
                messages.append(batch)
            batch.append(row)
        return messages

    async def _confirmed(
        self,
        batches: list[list[OutboxLease]],
        confirms: list[asyncio.Future[Any]],
        leased_at: float,
    ) -> None:
        """Await a published batch's confirms together, then mark the confirmed messages'
        rows."""
        async with asyncio.timeout(CONFIRM_TIMEOUT_S):
            outcomes = await asyncio.gather(*confirms, return_exceptions=True)
        confirmed = [
            row.id
            for batch, ok in zip(batches, outcomes, strict=True)
            if isinstance(ok, Basic.Ack)
            for row in batch
        ]
        rows = sum(len(b) for b in batches)
        # commit -> confirm
        metrics.OUTBOX_LAG.set(
            max(r.age_s for b in batches for r in b) + time.monotonic() - leased_at
        )
        if confirmed:
            await self._repo.mark_published(confirmed)
        if len(confirmed) < rows:  # published again once their lease expires
            failure = next(o for o in outcomes if not isinstance(o, Basic.Ack))
            if isinstance(failure, DeliveredMessage):  # returned: a queue was deleted
                await self._link.reconnect()  # which declares it again
            raise RuntimeError(
                f"{rows - len(confirmed)} of {rows} jobs' messages not confirmed: {failure!r}"
            )

    def _report(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            _failed(task.exception())  # type: ignore[arg-type]
            self._release_later()  # its unconfirmed rows

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


def _failed(exc: BaseException) -> None:
    metrics.BROKER_FAILURES.inc()
    log.error("relay round failed: %s", exc)
