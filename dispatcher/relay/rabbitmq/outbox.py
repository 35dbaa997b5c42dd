"""`OutboxRelay`: publishes outbox rows to RabbitMQ within each queue's window, gives back at once
the messages the broker did not confirm, and publishes again what the broker lost.

The lease takes (deletes) the rows it publishes and records each message it makes of them
(outbox_messages, migration 054): one write a message, where a leased row had cost two writes a
job. The record is what tells that a message is out.
What could leave a record with no message behind it is handled where it happens: an unconfirmed
message is given back by this relay (again each round until the database takes it), messages
awaiting their confirms at stop are given a moment and then given back, and the messages of a
daemon that died are given back by the due-scan's rescue once its liveness lock is gone. A
record names its relay only until the broker confirmed its message (one statement a batch of
messages, as the confirms arrive), so that rescue gives back only what may never have reached
the broker, not every message the daemon had out."""

from __future__ import annotations

import asyncio
import contextlib
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
SWEEP_EVERY_MIN_S, SWEEP_EVERY_MAX_S = 1.0, 60.0
# At stop, how long the batches published go on awaiting their confirms (milliseconds, as a
# rule) before they are given back to be published again.
STOP_CONFIRMS_S = 2.0
# The rows a consumer leased (a refused delivery's, held until it is due again) go back to the
# pick once their lease ran out, when this relay knows one can have (link.release_after: a
# second; a concurrency key's next token), and at least once a `relay_lease_s` for those of a
# daemon that died. A key's held rows come back sooner when one of its jobs ends or its limits
# change: the database releases them and wakes the relays (30_key_running.sql).
# Batches published and awaiting their confirms at once. A quorum queue confirms a batch of 500
# only once a majority wrote it (130-290 ms here); waiting for that before leasing the next
# batch capped the relay at ~2,000 messages/s.
ROUNDS_IN_FLIGHT = 4


class OutboxRelay(LoopService):
    """Publishes outbox rows to RabbitMQ, at most a window per queue ahead of the consumers,
    recording each message until a claim handled its jobs; gives back the messages the
    broker did not confirm; its sweep publishes again what the broker lost."""

    name = "outbox-relay"

    def __init__(
        self,
        repo: RelayRepository,
        link: RabbitLink,
        *,
        owner: str,
        batch: int,
        confirm_timeout_s: float,
        publish_ahead: float,
        republish_after_s: float,
    ):
        self._repo = repo
        self._link = link
        self._owner = owner
        self._batch = batch
        self._confirm_timeout_s = confirm_timeout_s
        # one consumer's window per queue; the lease widens it for each daemon registered
        self.windows = {q: math.ceil(publish_ahead * n) for q, n in link.prefetch.items()}
        self._publish_ahead = publish_ahead
        self._republish_after_s = republish_after_s
        # also the cadence at which messages handled without being counted leave the window
        self._sweep_every_s = min(
            max(min(republish_after_s / 4, confirm_timeout_s), SWEEP_EVERY_MIN_S),
            SWEEP_EVERY_MAX_S,
        )
        self._woken = asyncio.Event()
        self._release_at = 0.0  # monotonic: when a consumer's lease this relay knows of runs out
        self._unreleased: list[int] = []  # unconfirmed messages the database did not take back
        self._round_messages: dict[asyncio.Task[None], list[int]] = {}  # awaiting confirms
        self._confirms: list[int] = []  # confirmed messages the database did not record yet

    def set_max_inflight(self, queue: str, max_inflight: int) -> None:
        """A queue's max_inflight changed at run time: publish as far ahead of it as before."""
        if queue in self.windows:
            self.windows[queue] = math.ceil(self._publish_ahead * max_inflight)
            self._woken.set()  # a wider window: an idle relay publishes into it at once

    def wake(self) -> None:
        """Ready work may have new outbox rows: an idle relay leases at once."""
        self._woken.set()

    async def _give_back(self, messages: list[int]) -> None:
        """Messages the broker did not confirm: their jobs back to the pick, to be published
        again; kept for the next round if the database does not take them now."""
        self._unreleased.extend(messages)
        ids, self._unreleased = self._unreleased, []
        try:
            await self._repo.give_back(ids, self._owner)
        except BaseException:
            self._unreleased.extend(ids)
            raise
        self._woken.set()  # to publish at once (an idle relay waits for a wake-up)

    async def _run(self) -> None:
        now = time.monotonic()
        sweep_at = now + self._sweep_every_s
        self._release_at = now  # a previous relay's leases, at once
        release_every_at = now + self._confirm_timeout_s
        rounds: set[asyncio.Task[None]] = set()  # published, awaiting their confirms
        try:
            while True:
                await self._link.connected.wait()
                self._link.claimed.clear()
                self._woken.clear()
                try:
                    while len(rounds) >= ROUNDS_IN_FLIGHT:
                        await asyncio.wait(rounds, return_when=asyncio.FIRST_COMPLETED)
                    if self._unreleased:
                        await self._give_back([])
                    if self._confirms:  # a round could not record them: again, until it can
                        await self._record_confirms([])
                    now = time.monotonic()
                    release_at = min(self._release_at, self._link.release_due(), release_every_at)
                    if now >= release_at:
                        self._release_at = math.inf
                        self._link.released(now)
                        release_every_at = now + self._confirm_timeout_s
                        if await self._repo.release_outbox(self._batch) >= self._batch:
                            self._release_at = now  # more: again next round
                    leased = await self._publish_next(rounds)
                    if time.monotonic() >= sweep_at:
                        leased += await self.sweep_once()  # released: to publish at once
                        sweep_at = time.monotonic() + self._sweep_every_s
                except Exception as exc:  # broker or database: unconfirmed rows go out again
                    _failed(exc)
                    await asyncio.sleep(RECONNECT_FIRST_S)
                    continue
                if leased == 0:  # nothing new, or the windows are full: until a wake-up
                    await self._idle(
                        min(self._release_at, self._link.release_due(), sweep_at, release_every_at)
                    )
        finally:
            await self._stop_rounds(rounds)

    async def _stop_rounds(self, rounds: set[asyncio.Task[None]]) -> None:
        """At stop: the batches awaiting their confirms get a moment; the messages still
        unconfirmed then go back to the pick, for another daemon (or the next start) to publish
        again, and the confirms are recorded: the rescue that follows this daemon's stop gives
        none of those back to be published twice. Best effort: if the database is away, the
        rescue gives back every message still naming this relay (some a second time)."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            if rounds:
                await asyncio.wait(rounds, timeout=STOP_CONFIRMS_S)
            pending = [t for t in rounds if not t.done()]
            for task in pending:
                task.cancel()
            ids = [i for t in pending for i in self._round_messages.pop(t, [])]
            async with asyncio.timeout(STOP_CONFIRMS_S):
                if self._confirms:
                    await self._record_confirms([])
                if ids or self._unreleased:
                    await self._give_back(ids)

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

    async def _publish_next(self, rounds: set[asyncio.Task[None]]) -> int:
        """Take a batch and publish it at once; its confirms are awaited by a task added to
        `rounds` (the next batch need not wait for them). Return how many jobs were taken."""
        channel = self._link.publisher
        if channel is None:
            return 0
        per_message = {q: self._link.jobs_per_message(q) for q in self.windows}
        rows = await self._repo.lease_outbox(self.windows, per_message, self._batch, self._owner)
        if not rows:
            if not rounds:
                metrics.OUTBOX_LAG.set(0.0)
            return 0
        leased_at = time.monotonic()
        batches = self._messages(rows)
        messages = [
            (
                self._link.queue_name(batch[0].queue),
                *properties(batch[0].message, [(r.job_id, r.attempt) for r in batch]),
            )
            for batch in batches
        ]
        ids = [batch[0].message for batch in batches]
        try:
            confirms = await publish_batch(channel, messages)
        except BaseException:
            await asyncio.shield(self._give_back(ids))
            raise
        task = asyncio.ensure_future(self._confirmed(batches, confirms, leased_at))
        rounds.add(task)
        self._round_messages[task] = ids
        task.add_done_callback(rounds.discard)
        task.add_done_callback(self._report)
        return len(rows)

    async def _record_confirms(self, messages: list[int]) -> None:
        """The broker confirmed these messages: their records name this relay no more (with
        those an earlier try could not record, kept to be tried again with the next)."""
        self._confirms.extend(messages)
        ids, self._confirms = self._confirms, []
        try:
            await self._repo.record_confirmed(self._owner, ids)
        except BaseException:
            self._confirms.extend(ids)
            raise

    @staticmethod
    def _messages(rows: list[OutboxLease]) -> list[list[OutboxLease]]:
        """The jobs taken, as the lease made them into messages (per queue, slices of the
        pick's fair order): each message's jobs in that order, the messages in the order of
        their first jobs."""
        messages: dict[int, list[OutboxLease]] = {}
        for row in rows:
            messages.setdefault(row.message, []).append(row)
        return list(messages.values())

    async def _confirmed(
        self,
        batches: list[list[OutboxLease]],
        confirms: list[asyncio.Future[Any]],
        leased_at: float,
    ) -> None:
        """Await a published batch's confirms together; give back the messages the broker did
        not confirm (in time)."""
        try:
            async with asyncio.timeout(self._confirm_timeout_s):
                outcomes = await asyncio.gather(*confirms, return_exceptions=True)
        except TimeoutError:
            outcomes = [TimeoutError(f"no confirm in {self._confirm_timeout_s:g} s")] * len(
                confirms
            )
        unconfirmed = [
            batch[0].message
            for batch, ok in zip(batches, outcomes, strict=True)
            if not isinstance(ok, Basic.Ack)
        ]
        confirmed = [
            batch[0].message
            for batch, ok in zip(batches, outcomes, strict=True)
            if isinstance(ok, Basic.Ack)
        ]
        if confirmed:  # in the broker: the rescue after this daemon is not to publish them
            with contextlib.suppress(Exception):  # kept, to be recorded with the next (or at stop)
                await self._record_confirms(confirmed)
        rows = sum(len(b) for b in batches)
        # commit -> confirm
        metrics.OUTBOX_LAG.set(
            max(r.age_s for b in batches for r in b) + time.monotonic() - leased_at
        )
        if unconfirmed:  # back to the pick: published again
            failure = next(o for o in outcomes if not isinstance(o, Basic.Ack))
            try:
                if isinstance(failure, DeliveredMessage):  # returned: a queue was deleted
                    await self._link.reconnect()  # which declares it again, before the retry
            finally:
                await self._give_back(unconfirmed)
            raise RuntimeError(
                f"{len(unconfirmed)} of {len(batches)} messages ({rows} jobs) not confirmed: "
                f"{failure!r}"
            )

    def _report(self, task: asyncio.Task[None]) -> None:
        self._round_messages.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            _failed(task.exception())  # type: ignore[arg-type]
        if self._unreleased or self._confirms:  # a give-back or a record failed: the loop
            self._woken.set()  # retries it (an idle one at once)

    async def sweep_once(self) -> int:
        """Have the messages the broker lost published again: passes of at most one batch,
        until a pass finds fewer; return how many rows went back to the pick."""
        total = 0
        while True:
            found = await self._repo.sweep_unclaimed(
                self._republish_after_s, self._batch, self._confirm_timeout_s
            )
            swept = 0
            for queue, (republished, dropped) in found.items():
                swept += republished + dropped
                total += republished
                if republished:
                    metrics.OUTBOX_REPUBLISHED.labels(queue).inc(republished)
                    log.warning(
                        "%d messages of queue %s published over %.0f s ago and never claimed: "
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
