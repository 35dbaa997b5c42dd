"""`RabbitTransport`: what each queue's claim loop receives from RabbitMQ, leased in the
database, and the acknowledgement of a delivery once its attempt ended."""

from __future__ import annotations

import asyncio
import contextlib

from dispatcher.db.claims import ClaimConnections
from dispatcher.model import AttemptKey, ByteGrant
from dispatcher.observability import metrics
from dispatcher.relay.rabbitmq.acks import Received
from dispatcher.relay.rabbitmq.link import RabbitLink
from dispatcher.relay.transport import Delivery

SETTLE_TIMEOUT_S = 5.0  # acknowledgements after the drain; an unacked one is a duplicate later
# A claim waits for more deliveries when fewer arrived than it could start, as long as they keep
# coming (each at most GATHER_S after the one before) and for at most GATHER_MAX_S in all: the
# broker sends a published batch as a stream, and one claim statement per few deliveries cost
# more than the wait (bench_scaleout, 5,000 jobs: 450 claims of ~11 deliveries each before; with
# one 2 ms wait, 20,000 jobs: claims of ~180; gathering while the stream lasts: ~280, and the
# completions, one per claim's jobs, grow with them).
GATHER_S = 0.002
GATHER_MAX_S = 0.01


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
        self._acks: dict[AttemptKey, Received] = {}

    async def wait_for_work(self, queue: str, limit: int) -> None:
        """Until a delivery of `queue` waits (at most `wait_s`), then while more of the same
        stream arrive (bounded), so one claim takes them all."""
        waiting = self._link.inbox[queue]
        if not waiting:
            arrived = self._link.arrived[queue]
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait_s):
                    await arrived.wait()
        if not waiting:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + GATHER_MAX_S
        arrived = self._link.arrived[queue]
        while len(waiting) < limit and self._link.receiving(queue) and loop.time() < until:
            arrived.clear()
            try:
                async with asyncio.timeout(min(GATHER_S, until - loop.time())):
                    await arrived.wait()
            except TimeoutError:  # the stream paused: claim what came
                return

    async def receive(self, queue: str, limit: int, grant: ByteGrant) -> Delivery:
        waiting = self._link.inbox[queue]
        batch = [waiting.popleft() for _ in range(min(limit, len(waiting)))]
        if not batch:  # waited for a delivery already: ask again at once
            return Delivery([], 0, 0.0)
        by_job: dict[int, Received] = {}
        dropped: list[int | None] = []  # their messages: the claim counts them handled
        for received in batch:
            if received.job_id in by_job:  # the same job twice in one batch: one is a duplicate
                received.acks.ack(received.tag)
                dropped.append(received.message)
            else:
                by_job[received.job_id] = received
        duplicates = len(dropped)
        try:
            claimed = await self._claims.claim_delivered(
                queue,
                [(r.job_id, r.attempt) for r in by_job.values()],
                self._capabilities,
                self._owner,
                self._lease_s,
                grant,
                [r.message for r in by_job.values()],
                dropped,
            )
        except Exception:
            if self._link.receiving(queue):
                waiting.extendleft(reversed(by_job.values()))
            else:
                for received in by_job.values():
                    received.acks.give_back(received.tag)
            raise
        # eligible and not started: the limits held them back (one set difference: taken
        # inside the comprehension it was one per delivery, 39 % of the daemon's CPU in a drain)
        held_back = claimed.eligible - {job.id for job in claimed.jobs}
        held = [r for r in by_job.values() if r.job_id in held_back]
        for job_id, received in by_job.items():
            if job_id not in claimed.eligible:  # done, another attempt's, or refused: not here
                duplicates += job_id not in claimed.refused
                received.acks.ack(received.tag)
        if claimed.expired:  # past their time to live when claimed: ended, not started
            metrics.DEAD_LETTERS.labels(queue, "expired").inc(claimed.expired)
            metrics.JOBS_COMPLETED.labels(queue, "dead").inc(claimed.expired)
        if claimed.refused:  # the claim wrote them new outbox rows: out again to any daemon
            # (those of a key at its limit: out again once the key has room, migration 024)
            metrics.DELIVERIES_REFUSED.labels(queue).inc(len(claimed.refused) - claimed.key_held)
            # their rows are leased until they are due again (a second; a key's next room)
            self._link.release_after(claimed.release_in_s)
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
            key_throttled=claimed.key_held > 0,
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
