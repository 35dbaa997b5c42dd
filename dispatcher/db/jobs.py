"""The jobs repository: one typed method per named query. Callers never see SQL or asyncpg."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, NamedTuple, cast

import asyncpg

from dispatcher.db import contracts
from dispatcher.db.job_control import JobControl
from dispatcher.db.job_reads import JobReads
from dispatcher.db.outcomes import (
    ERROR_CHARS,
    EXCERPT_CHARS,
    REASON_CHARS,
    result_json,
    storable_result,
    storable_text,
)
from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query
from dispatcher.db.registry import sync_registry
from dispatcher.model import (
    UNBOUNDED,
    AttemptKey,
    ByteGrant,
    EnqueueResult,
    Job,
    NewJob,
)

# Query texts resolved once; the hot paths look them up per call otherwise.
_CLAIM = query("claim_ready")
_COMPLETE = query("complete_succeeded")
_RECORD_FAILURE = query("record_failure")
_SNOOZE = query("snooze_job")
# claim_ready and claim_delivered return a Job's fields first, in the dataclass's order
# (tests/db/test_traceparent.py)
CLAIM_JOB_COLUMNS = 17


def item_columns(items: Sequence[NewJob]) -> tuple[list[Any], ...]:
    """The columns every enqueue statement takes first, one array per field, in item order."""
    return (
        [i.key for i in items],
        [i.handler for i in items],
        [i.payload for i in items],
        [i.due_at for i in items],
        [i.queue for i in items],
        [i.tenant for i in items],
        [i.target for i in items],
        [i.max_attempts for i in items],
        [i.max_retry_age_s for i in items],
    )


class JobRepository(JobReads, JobControl):
    """All reads and writes of jobs and the outbox. The database clock decides every time.
    The doors' reads are in `JobReads` (db/job_reads.py), operator control in `JobControl`
    (db/job_control.py); this class adds intake, the scan, rescue, the hot path and upkeep."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool
        self._cursors = ClaimCursors()

    # intake -------------------------------------------------------------------------------
    @translate_unavailable
    async def enqueue_many(
        self, items: Sequence[NewJob], conn: asyncpg.Connection | None = None
    ) -> list[EnqueueResult]:
        args = (
            *item_columns(items),
            [i.run_key for i in items],
            [i.priority for i in items],
            [i.concurrency_key for i in items],
        )
        # tracing on, or a job with a contract: more to write in the same transaction
        if any(i.traceparent is not None or i.has_contract for i in items):
            if conn is not None:
                results = await self._enqueue_traced(conn, items, args)
            else:
                async with self.pool.acquire() as own:
                    results = await self._enqueue_traced(own, items, args)
        else:
            executor = conn if conn is not None else self.pool
            results = _enqueued(await executor.fetch(query("enqueue_many"), *args), len(items))
        if any(r.outcome == "existing" for r in results):
            return await contracts.replayed(conn or self.pool, items, results)
        return results

    async def replace_scheduled(self, items: Sequence[NewJob]) -> list[EnqueueResult | None]:
        """Key modes: replace the scheduled jobs these items' keys name (in one statement);
        one result per item, in order: None when its job is gone (pruned meanwhile)."""
        rows = await self.pool.fetch(
            query("replace_scheduled"),
            *item_columns(items),
            [i.on_key == "keep_due" for i in items],
            [i.debounce_max_s for i in items],
            [i.priority for i in items],
            [i.concurrency_key for i in items],
            *contracts.columns(items),
        )
        results: list[EnqueueResult | None] = [None] * len(items)
        for r in rows:
            results[r["ord"] - 1] = EnqueueResult(
                r["id"], r["key"], r["state"], r["due_at"], r["created_at"], r["outcome"]
            )
        return results

    async def _enqueue_traced(
        self, conn: asyncpg.Connection, items: Sequence[NewJob], args: tuple[list[Any], ...]
    ) -> list[EnqueueResult]:
        """enqueue_many, then the trace context of each job it created, in one transaction:
        no claim can see a created job before its traceparent (a retried request's existing
        job keeps the context it was created in)."""
        async with conn.transaction():
            results = _enqueued(await conn.fetch(query("enqueue_many"), *args), len(items))
            made = [
                (result.id, item)
                for item, result in zip(items, results, strict=True)
                if result.outcome == "created"
            ]
            traced = [(i, item.traceparent) for i, item in made if item.traceparent is not None]
            if traced:
                ids, traceparents = zip(*traced, strict=True)
                await conn.execute(query("set_traceparents"), list(ids), list(traceparents))
            await contracts.store(conn, [(i, item) for i, item in made if item.has_contract])
        return results

    # scanning and rescue ------------------------------------------------------------------
    async def scan_due(self, batch: int, ahead_s: float = 0.0) -> DueMoved:
        """Move up to `batch` scheduled jobs due within `ahead_s` to ready (db/queries.sql)."""
        row = await self.pool.fetchrow(query("scan_due"), batch, ahead_s)
        return DueMoved(
            row["moved"], row["due_now"], list(row["due_in_s"]), list(row["due_counts"])
        )

    async def wake_ready(self) -> None:
        """NOTIFY every listening daemon that jobs are ready (dispatcher.wake('ready'))."""
        await self.pool.execute(query("wake_ready"))

    async def expire_unstarted(self, batch: int) -> dict[str, int]:
        """End up to `batch` scheduled or ready jobs past their time to live (`dead`,
        `expired`); how many per queue."""
        rows = await self.pool.fetch(query("expire_unstarted"), batch)
        return {r["queue"]: r["n"] for r in rows}

    async def seconds_to_next_due(self) -> float | None:
        seconds: float | None = await self.pool.fetchval(query("seconds_to_next_due"))
        return seconds

    async def poll_work(self, queues: Sequence[str], capabilities: list[str]) -> WorkSeen:
        """One look for work (db/claims.sql `poll_work`): ready queues, next due, expiry."""
        row = await self.pool.fetchrow(query("poll_work"), list(queues), capabilities)
        return WorkSeen(list(row["ready"]), row["next_due_s"], row["lease_expired"])

    async def rescue_expired_leases(self, batch: int) -> dict[str, int]:
        """Rescue expired leases only; jobs per new state."""
        by_state: dict[str, int] = {}
        for (_why, state), n in (await self.rescue(batch, ())).items():
            by_state[state] = by_state.get(state, 0) + n
        return by_state

    async def rescue(self, batch: int, gone_owners: Sequence[str]) -> dict[tuple[str, str], int]:
        """Rescue expired leases, and the running jobs of `gone_owners` (daemons whose liveness
        lock was seen released); jobs per (why, new state), why being `lease_expired` or
        `owner_gone`. First, the outbox rows the gone owners' relays leased go back to be
        published again (the rescue forgets an owner once it has no running job)."""
        if gone_owners:
            await self.pool.execute(query("release_gone_relays"), list(gone_owners))
        rows = await self.pool.fetch(query("rescue_expired_leases"), batch, list(gone_owners))
        return {(r["why"], r["state"]): r["n"] for r in rows}

    # the hot path -------------------------------------------------------------------------
    async def claim(
        self,
        queue: str,
        limit: int,
        capabilities: list[str],
        owner: str,
        lease_s: float,
        grant: ByteGrant = UNBOUNDED,
    ) -> tuple[list[Job], int]:
        """Claim up to `limit` jobs; return them and the number of outbox rows consumed."""
        claim = await self.claim_limited(queue, limit, capabilities, owner, lease_s, grant)
        return claim.jobs, claim.consumed

    async def claim_limited(
        self,
        queue: str,
        limit: int,
        capabilities: list[str],
        owner: str,
        lease_s: float,
        grant: ByteGrant = UNBOUNDED,
    ) -> Claim:
        """Claim up to `limit` jobs within the queue's global limits and the bytes of `grant`
        (the last row of the claim is always its marker)."""
        return await claim_on(
            self.pool, queue, limit, capabilities, owner, lease_s, grant, self._cursors
        )

    async def complete(
        self,
        ids: list[int],
        attempts: list[int],
        results: list[Any],
        owner: str,
        *,
        http_statuses: list[int | None] | None = None,
        latencies_s: list[float | None] | None = None,
        excerpts: list[str | None] | None = None,
    ) -> set[AttemptKey]:
        """Record successes and their attempt history rows (the optional lists run parallel to
        `ids`; None records nothing for that column); returns the (job id, attempt) pairs this
        owner still held. Results and excerpts are stored in their safe form (db/outcomes.py)."""
        texts = [result_json(r) for r in results]
        if excerpts is not None:
            excerpts = [storable_text(e, EXCERPT_CHARS) for e in excerpts]
        rows = await self.pool.fetch(
            _COMPLETE, ids, attempts, texts, owner, http_statuses, latencies_s, excerpts
        )
        return {(r[0], r[1]) for r in rows}

    async def complete_in(
        self,
        conn: asyncpg.Connection,
        job: Job,
        result: Any,
        owner: str,
        latency_s: float | None = None,
    ) -> bool:
        rows = await conn.fetch(
            _COMPLETE,
            [job.id],
            [job.attempt],
            [result_json(result)],
            owner,
            None,
            [latency_s],
            None,
        )
        return bool(rows)

    async def record_failure(
        self,
        job: Job,
        owner: str,
        *,
        permanent: bool,
        delay_s: float,
        error: str,
        reason: str | None,
        retry_after_s: float | None = None,
        http_status: int | None = None,
        latency_s: float | None = None,
    ) -> tuple[str, str | None] | None:
        """Record a failed attempt and its history row. `retry_after_s` is the delay the target
        asked for (its Retry-After), if any: when that alone reaches past the retry age, the
        job is dead as `retry_after_beyond_age`. Returns the job's new state and dead reason,
        or None when the lease was no longer this owner's."""
        row = await self.pool.fetchrow(
            _RECORD_FAILURE,
            job.id,
            job.attempt,
            owner,
            permanent,
            delay_s,
            storable_text(error, ERROR_CHARS),
            storable_text(reason, REASON_CHARS),
            retry_after_s,
            http_status,
            latency_s,
        )
        return (row["state"], row["dead_reason"]) if row else None

    async def snooze(
        self,
        job: Job,
        owner: str,
        *,
        delay_s: float,
        until: datetime | None,
        reason: str,
        max_snoozes: int,
        latency_s: float | None = None,
    ) -> tuple[str, str | None] | None:
        """Put the job back to `scheduled` at `until` (or in `delay_s`) without spending its
        attempt (the handler snoozed it), bounded by its retry age and `max_snoozes` (past
        either, it is dead); returns its new state and dead reason, or None when the lease
        was not ours."""
        row = await self.pool.fetchrow(
            _SNOOZE,
            job.id,
            job.attempt,
            owner,
            delay_s,
            storable_text(reason, ERROR_CHARS),
            max_snoozes,
            latency_s,
            until,
        )
        return (row["state"], row["dead_reason"]) if row else None

    async def save_progress(
        self, conn: asyncpg.Connection, job: Job, owner: str, progress: dict[str, Any]
    ) -> bool:
        status: str = await conn.execute(
            query("save_progress"), job.id, job.attempt, owner, storable_result(progress)
        )
        return status.endswith(" 1")

    async def extend_leases(
        self, attempts: Sequence[AttemptKey], owner: str, lease_s: float
    ) -> int:
        """Extend the leases of these attempts that `owner` still holds; rows locked by another
        transaction are skipped, never waited for."""
        ids, numbers = _split(attempts)
        status = await self.pool.execute(query("extend_leases"), ids, numbers, owner, lease_s)
        return int(status.rsplit(" ", 1)[-1])

    async def release_leases(self, attempts: Sequence[AttemptKey], owner: str) -> int:
        ids, numbers = _split(attempts)
        return int(await self.pool.fetchval(query("release_leases"), ids, numbers, owner))

    async def prune_terminal(self, state: str, older_than_s: float, batch: int) -> int:
        """Delete a batch of old terminal jobs with their attempt history; returns the jobs."""
        return int(await self.pool.fetchval(query("prune_terminal"), state, older_than_s, batch))

    async def prune_keys(self, older_than_s: float, batch: int) -> int:
        """Forget a batch of key ledger rows older than the key retention; returns how many."""
        status = await self.pool.execute(query("prune_keys"), older_than_s, batch)
        return int(status.rsplit(" ", 1)[-1])

    async def prune_runs(self, older_than_s: float, batch: int) -> int:
        """Run receipts go only after their units: a receipt never outlives its evidence."""
        status = await self.pool.execute(query("prune_runs"), older_than_s, batch)
        return int(status.rsplit(" ", 1)[-1])

    async def sync_registry(self, *args: Any, **kwargs: Any) -> None:
        """`db.registry.sync_registry` on this repository's pool."""
        await sync_registry(self.pool, *args, **kwargs)

    async def lock_running(self, conn: asyncpg.Connection, job: Job, owner: str) -> bool:
        """Inside a transaction: lock the job if this owner still holds its lease."""
        locked = await conn.fetchval(query("lock_running_job"), job.id, job.attempt, owner)
        return bool(locked == 1)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection, waited for as long as it takes (the caller bounds the wait)."""
        async with self.pool.acquire(timeout=None) as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection inside a transaction (commits unless the block raises)."""
        async with self.pool.acquire() as conn, conn.transaction():
            yield conn


async def claim_on(
    db: asyncpg.Pool | asyncpg.Connection,
    queue: str,
    limit: int,
    capabilities: list[str],
    owner: str,
    lease_s: float,
    grant: ByteGrant,
    cursors: ClaimCursors | None = None,
) -> Claim:
    """`claim_ready` on a pool or on a connection a claim loop borrowed (db/claims.py). With
    `cursors`, the tenants' turns go on from where the previous claim of `queue` stopped."""
    after = cursors.get(queue) if cursors is not None else None
    rows = await db.fetch(
        _CLAIM,
        queue,
        limit,
        capabilities,
        owner,
        lease_s,
        grant.bytes,
        grant.alone,
        after[0] if after else None,
        after[1] if after else None,
    )
    marker = rows[-1]
    if cursors is not None and marker["cursor_priority"] is not None:
        cursors[queue] = (marker["cursor_priority"], marker["cursor_tenant"])
    return claimed_rows(rows)


class ClaimCursors(dict[str, tuple[int, str]]):
    """Per queue, the (priority, tenant) a claimer served last: its next claim's tenant walk
    starts after it, so tenants take turns across claims (migration 023, claim_pick)."""


class DueMoved(NamedTuple):
    """What one round of the due-scan's move did."""

    moved: int
    due_now: int  # of those moved, the jobs already due
    # in how many seconds the jobs it moved ahead of their due time fall due (per due time,
    # rounded up to the millisecond; counted from the statement's end, so never early), and
    # how many fall due at each
    due_in_s: list[float]
    due_counts: list[int]


class WorkSeen(NamedTuple):
    """What one poll for work saw."""

    ready: list[str]  # the queues with a ready job this daemon can run (not paused)
    next_due_s: float | None  # until the earliest scheduled job is due; None: none waiting
    # a running job's lease has expired (the due-scan rescues it), or a waiting job's time to
    # live passed (the due-scan ends it)
    lease_expired: bool


class Claim(NamedTuple):
    """What one claim statement did."""

    jobs: list[Job]
    consumed: int  # outbox rows taken (ready jobs, in process)
    wait_s: float | None  # the global limits held the claim back: a token is free after this
    held_back: bool  # the memory budget left picked jobs ready: claim again once bytes free
    expired: int = 0  # ready jobs it ended `dead` (expired) instead of starting (migration 030)
    key_throttled: bool = False  # a concurrency key at its limit held jobs back (migration 024)
    # nothing else is ready for this worker: the loop waits for a wake-up without looking again
    drained: bool = False


def claimed_rows(rows: list[asyncpg.Record]) -> Claim:
    """A claim's rows: the jobs, then its marker row (always last)."""
    marker = rows[-1]
    jobs = [Job(*r[:CLAIM_JOB_COLUMNS]) for r in rows if r[0] is not None]
    return Claim(
        jobs,
        marker["taken_count"],
        marker["wait_s"],
        marker["held_back"],
        marker["expired_count"],
        bool(marker["key_throttled"]),
        bool(marker["drained"]),
    )


def _enqueued(rows: list[asyncpg.Record], n: int) -> list[EnqueueResult]:
    results: list[EnqueueResult | None] = [None] * n
    for r in rows:
        results[r["ord"] - 1] = EnqueueResult(
            r["id"], r["key"], r["state"], r["due_at"], r["created_at"], r["outcome"]
        )
    return cast(list[EnqueueResult], results)  # the function answers every item


def _split(attempts: Sequence[AttemptKey]) -> tuple[list[int], list[int]]:
    return [job_id for job_id, _ in attempts], [attempt for _, attempt in attempts]
