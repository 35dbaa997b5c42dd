"""The transport between the outbox and the worker pool.

A transport hands a queue's worker at most `limit` ready jobs, each already leased to this
process: the worker reserved that many in-flight slots and start tokens first, so nothing is ever
held in memory with a lease it cannot use. `consumed` counts the outbox rows taken; rows whose
job was no longer ready (a re-published message) are duplicate deliveries, dropped unrun.

The in-process transport fuses relay and claim: one statement deletes the outbox rows and leases
their jobs, so "published" and "claimed" commit together. A crash at any instant leaves either
the outbox row (claimed later) or a lease that expires and is rescued back to `ready` with a new
outbox row. The broker transport (RabbitMQ, relay/rabbitmq/) splits this into a relay that
publishes outbox rows and marks them published, and a consumer that claims what it receives by
job id (deleting those rows) and acknowledges after the completion commits.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from dispatcher.db.claims import ClaimConnections
from dispatcher.model import AttemptKey, ByteGrant, Job
from dispatcher.observability import metrics


class Delivery(NamedTuple):
    jobs: list[Job]
    consumed: int  # outbox rows taken; more than len(jobs) means duplicate deliveries
    # the queue's global limits held the claim back: look again after this many seconds
    wait_s: float | None = None
    # the daemon's memory budget held jobs back: claim again once in-flight bytes are freed
    held_back: bool = False
    # a concurrency key at its limit held jobs back (dispatcher_key_throttled_claims)
    key_throttled: bool = False
    # nothing else is ready for this worker: wait for a wake-up without looking again
    drained: bool = False


class Transport(Protocol):
    async def wait_for_work(self, queue: str, limit: int) -> None:
        """Until a `receive` of up to `limit` jobs may find some (a broker transport waits for
        deliveries, bounded). Called before the claim takes its share of the daemon's memory
        budget: a queue that waits holds none of it, so it never holds up other queues."""

    async def receive(self, queue: str, limit: int, grant: ByteGrant) -> Delivery:
        """At most `limit` jobs of `queue`, whose payload and target bytes fit in `grant`."""

    async def more_ready(self, queue: str) -> bool:
        """After a receive that took fewer jobs than asked: whether to receive again at once
        (True) or to wait for a wake-up. True whenever in doubt."""

    def finished(self, key: AttemptKey) -> None:
        """The attempt `key` ended (a broker transport acknowledges its delivery now)."""

    async def stop_receiving(self, queue: str) -> None:
        """The drain began: take nothing more for `queue` and hand back what was received but
        not started (a broker transport returns those deliveries to the broker at once)."""

    async def settle(self) -> None:
        """The drain ended: wait (bounded) for the acknowledgements still on their way."""


class InProcessTransport:
    """Relay and claim in one statement, fair across tenants (see `claim_ready`). Every queue
    claims on the daemon's few shared claim connections (db/claims.py), one claim at a time."""

    def __init__(
        self, claims: ClaimConnections, *, owner: str, capabilities: list[str], lease_s: float
    ):
        self._claims = claims
        self._owner = owner
        self._capabilities = capabilities
        self._lease_s = lease_s

    async def wait_for_work(self, queue: str, limit: int) -> None:
        return None  # the claim itself looks

    async def receive(self, queue: str, limit: int, grant: ByteGrant) -> Delivery:
        claim = await self._claims.claim(
            queue, limit, self._capabilities, self._owner, self._lease_s, grant
        )
        if claim.expired:  # past their time to live when claimed: ended, not started
            metrics.DEAD_LETTERS.labels(queue, "expired").inc(claim.expired)
            metrics.JOBS_COMPLETED.labels(queue, "dead").inc(claim.expired)
        return Delivery(
            claim.jobs,
            claim.consumed,
            claim.wait_s,
            claim.held_back,
            claim.key_throttled,
            claim.drained,
        )

    async def more_ready(self, queue: str) -> bool:
        return await self._claims.ready_left(queue, self._capabilities)

    def finished(self, key: AttemptKey) -> None:
        return None  # the claim took the outbox row: nothing to acknowledge

    async def stop_receiving(self, queue: str) -> None:
        return None  # no job is held between claims (a claim in flight ends before the drain)

    async def settle(self) -> None:
        return None  # the claim connections are a service of their own, stopped after the drain
