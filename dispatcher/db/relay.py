"""The RabbitMQ transport's repository: the outbox relay, its sweep and the consumer's claim
(the statements of relay.sql). Callers never see SQL or asyncpg."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import asyncpg

from dispatcher.db.jobs import CLAIM_JOB_COLUMNS
from dispatcher.db.queries import query
from dispatcher.model import UNBOUNDED, AttemptKey, ByteGrant, Job

_CLAIM_DELIVERED = query("claim_delivered")
_LEASE_OUTBOX = query("lease_outbox")
_GIVE_BACK_MESSAGES = query("give_back_messages")
_RELEASE_OUTBOX = query("release_outbox")
_RECORD_CONFIRMED = query("record_confirmed")


class OutboxLease(NamedTuple):
    """One job a relay took to publish, and the message that carries it."""

    message: int  # the message's id (outbox_messages, migration 054)
    job_id: int
    queue: str
    attempt: int  # the attempt the job is ready to start after (the consumer's fence)
    age_s: float  # since the job's row was written (commit -> lease)
    priority: int = 0  # where the row stands in its queue's turns (the relay's next cursor)
    tenant: str = ""
    turn: int = 0


class Claimed(NamedTuple):
    jobs: list[Job]
    eligible: set[int]  # ready for the delivered attempt; those not in `jobs` were held back
    refused: set[int]  # ready, but for a handler version this process cannot run
    wait_s: float | None  # the queue's limits (or its pause) held the claim back this long
    expired: int = 0  # delivered in time, past their TTL when claimed: ended, not started
    key_held: int = 0  # of `refused`, those whose concurrency key was at its limit (024)
    # in how many seconds the refused rows' leases run out (a second; a key's next room)
    release_in_s: tuple[float, ...] = ()


class RelayRepository:
    """Outbox rows as the relay and the consumers see them; the database clock decides."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool
        # per queue, the (priority, tenant) leased last: the next lease's turns start after it
        self._cursors: dict[str, tuple[int, str]] = {}

    async def lease_outbox(
        self, windows: dict[str, int], per_message: dict[str, int], batch: int, owner: str
    ) -> list[OutboxLease]:
        """Take up to `batch` rows nobody holds for relay `owner`, each queue at most its window
        (`windows`: one consumer's, times the daemons registered) ahead of its consumers, by
        priority, then tenants in turn, and record them as messages of at most `per_message`
        jobs of their queue; the jobs in the order to publish them."""
        queues = list(windows)
        after = [self._cursors.get(q) for q in queues]
        rows = await self.pool.fetch(
            _LEASE_OUTBOX,
            queues,
            list(windows.values()),
            [per_message[q] for q in queues],
            batch,
            [a[0] if a else None for a in after],
            [a[1] if a else None for a in after],
            owner,
        )
        leases = [OutboxLease(*r) for r in rows]
        last: dict[str, OutboxLease] = {}
        for lease in leases:  # the last tenant served, at the last priority reached
            seen = last.get(lease.queue)
            if seen is None or (lease.priority, lease.turn) > (seen.priority, seen.turn):
                last[lease.queue] = lease
        self._cursors.update({q: (r.priority, r.tenant) for q, r in last.items()})
        return leases

    async def release_outbox(self, batch: int) -> int:
        """Return up to `batch` rows a consumer leased (refused, held by a key) whose lease ran
        out to the rows the relays pick from; how many."""
        return int(await self.pool.fetchval(_RELEASE_OUTBOX, batch))

    async def give_back(self, messages: list[int], owner: str) -> None:
        """The broker did not confirm these messages of relay `owner`: their jobs still ready
        back to the pick, to be published again."""
        await self.pool.execute(_GIVE_BACK_MESSAGES, messages, owner)

    async def record_confirmed(self, owner: str, messages: Sequence[int]) -> int:
        """The broker confirmed these messages of relay `owner`: they name no relay from now
        on, so no rescue after its daemon's end gives them back to be published twice (a record
        a claim holds at that moment is left as it is). How many were recorded."""
        return int(await self.pool.fetchval(_RECORD_CONFIRMED, owner, list(messages)))

    async def sweep_unclaimed(
        self, older_than_s: float, batch: int, handled_after_s: float | None = None
    ) -> dict[str, tuple[int, int]]:
        """Have the messages lost in the broker published again: up to `batch` messages not
        handled within `older_than_s` (and as many rows an earlier release's relays leased);
        forget those older than `handled_after_s` whose jobs all left ready (handled, but not
        counted); return, per queue, how many jobs went back to the pick (published again)
        and how many were no longer ready."""
        found: dict[str, tuple[int, int]] = {}
        handled_after_s = older_than_s if handled_after_s is None else handled_after_s
        for name, args in (
            ("sweep_lost_messages", (older_than_s, batch, handled_after_s)),
            ("sweep_unclaimed", (older_than_s, batch)),
        ):
            for r in await self.pool.fetch(query(name), *args):
                again, dropped = found.get(r["queue"], (0, 0))
                found[r["queue"]] = (again + r["republished"], dropped + r["dropped"])
        return found

    async def claim_delivered(
        self,
        queue: str,
        deliveries: Sequence[AttemptKey],
        capabilities: list[str],
        owner: str,
        lease_s: float,
        grant: ByteGrant = UNBOUNDED,
        messages: Sequence[int | None] = (),
        duplicates: Sequence[int | None] = (),
    ) -> Claimed:
        """Lease delivered jobs this process can run, each fenced by the attempt its message
        was published after, within the queue's global limits and the bytes of `grant`; count
        the jobs handled in the messages that carried them (`messages`, one per delivery:
        none, an earlier release's message; `duplicates`, the messages of deliveries dropped
        as a second one of a job), whose window they leave."""
        return await claim_delivered_on(
            self.pool, queue, deliveries, capabilities, owner, lease_s, grant, messages, duplicates
        )


async def claim_delivered_on(
    db: asyncpg.Pool | asyncpg.Connection,
    queue: str,
    deliveries: Sequence[AttemptKey],
    capabilities: list[str],
    owner: str,
    lease_s: float,
    grant: ByteGrant,
    messages: Sequence[int | None] = (),
    duplicates: Sequence[int | None] = (),
) -> Claimed:
    """`claim_delivered` on a pool or on a connection a claim loop borrowed (db/claims.py)."""
    ids = [job_id for job_id, _ in deliveries]
    attempts = [attempt for _, attempt in deliveries]
    rows = await db.fetch(
        _CLAIM_DELIVERED,
        queue,
        ids,
        attempts,
        owner,
        lease_s,
        capabilities,
        grant.bytes,
        grant.alone,
        list(messages) or [None] * len(ids),
        list(duplicates),
    )
    return claimed_deliveries(rows)


def claimed_deliveries(rows: list[asyncpg.Record]) -> Claimed:
    """`claim_delivered`'s rows: the jobs started, then a marker row with the verdicts."""
    marker = rows[-1]
    return Claimed(
        [Job(*r[:CLAIM_JOB_COLUMNS]) for r in rows if r[0] is not None],
        set(marker["eligible"]),
        set(marker["refused"]),
        marker["wait_s"],
        marker["expired_count"],
        marker["key_held"],
        tuple(marker["release_in_s"]),
    )
