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
_RELEASE_LEASED = query("release_leased")
_RELEASE_OUTBOX = query("release_outbox")


class OutboxLease(NamedTuple):
    """One leased outbox row and what its message carries."""

    id: int
    job_id: int
    queue: str
    key: str
    attempt: int  # the attempt the job is ready to start after (the consumer's fence)
    age_s: float  # since the row was written (commit -> lease)
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
        self, windows: dict[str, int], batch: int, lease_s: float, owner: str
    ) -> list[OutboxLease]:
        """Lease up to `batch` rows nobody holds to `owner` for `lease_s` (until their messages
        count as lost), each queue at most its window ahead of its consumers, by priority, then
        tenants in turn; in the order to publish them."""
        queues = list(windows)
        after = [self._cursors.get(q) for q in queues]
        rows = await self.pool.fetch(
            _LEASE_OUTBOX,
            queues,
            list(windows.values()),
            lease_s,
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

    async def release_leased(self, ids: list[int], owner: str) -> None:
        """The broker did not confirm these rows' messages: back to the pick, unless a claim
        or another relay has them now."""
        await self.pool.execute(_RELEASE_LEASED, ids, owner)

    async def sweep_unclaimed(self, older_than_s: float, batch: int) -> dict[str, tuple[int, int]]:
        """Have the messages lost in the broker published again; return, per queue, how many
        rows went back to the pick (published again) and how many left-over rows were
        deleted."""
        rows = await self.pool.fetch(query("sweep_unclaimed"), older_than_s, batch)
        return {r["queue"]: (r["republished"], r["dropped"]) for r in rows}

    async def claim_delivered(
        self,
        queue: str,
        deliveries: Sequence[AttemptKey],
        capabilities: list[str],
        owner: str,
        lease_s: float,
        grant: ByteGrant = UNBOUNDED,
    ) -> Claimed:
        """Lease delivered jobs this process can run, each fenced by the attempt its message
        was published after, within the queue's global limits and the bytes of `grant`; delete
        the relay's rows of the jobs started (their messages are consumed)."""
        return await claim_delivered_on(
            self.pool, queue, deliveries, capabilities, owner, lease_s, grant
        )


async def claim_delivered_on(
    db: asyncpg.Pool | asyncpg.Connection,
    queue: str,
    deliveries: Sequence[AttemptKey],
    capabilities: list[str],
    owner: str,
    lease_s: float,
    grant: ByteGrant,
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
