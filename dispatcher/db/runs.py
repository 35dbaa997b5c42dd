"""The cron runs repository: run receipts, their units, missed periods, per-schedule accounting.

A run and its units are created in one transaction, under a per-schedule advisory lock, so a
period has either a receipt with all of its units or nothing: a trigger that fails half-way
(137 of 240 units written, then the connection drops) leaves no trace, and its retry creates
the run once. The unit keys are deterministic as well, so even units that did survive elsewhere
(enqueued through the SQL door with the same keys) converge instead of doubling.

A run finishes when none of its units is scheduled, ready or running. The statement that marks
it finished (`finished_at IS NULL` -> now, at most once whoever runs it) and the enqueue of its
`on_finished` follow-up (key `<run_key>:finished`) commit in one transaction, so a follow-up
exists exactly when its run is finished: a crash between the two rolls both back and the next
sweep, on any instance, does it again; the key makes a second follow-up impossible anyway.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from dispatcher.core import rfc3339
from dispatcher.core.faults import fault_point
from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query
from dispatcher.errors import DatabaseUnavailable, DispatcherError
from dispatcher.model import NewJob

log = logging.getLogger(__name__)

_DECISIONS = {"allow": "allowed", "skip": "skipped", "queue": "queued"}
# Errors that mean the trigger's transaction did not commit (it rolled back or never finished).
_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
    DatabaseUnavailable,  # as JobRepository.enqueue_many translates a lost connection
)

# Plans the jobs of a run: gets the fan-out query's first-column values (None when the
# schedule's units are static) and returns one NewJob per unit.
PlanJobs = Callable[[list[Any] | None], list[NewJob]]
AfterUnitBatch = Callable[[int], Awaitable[None]]


class TriggerFailed(DispatcherError):
    """A trigger did not commit: nothing of its run exists, and retrying it is safe."""


class UnitConflict(TriggerFailed):
    """A unit key already names a job with a different request (so the run cannot be created)."""


class SchedulePaused(DispatcherError):
    """A cron fire found its schedule paused by an operator (checked under the schedule's lock,
    so no fire creates a run once a pause has committed)."""


@dataclass(frozen=True, slots=True)
class RunReceipt:
    """What one period of a schedule produced. `outcome` says what this call did: `created`
    the run, or found it `existing`. Counters cover the units that exist; `pending` is what
    is neither succeeded, dead, discarded nor cancelled (including units of a queued run)."""

    run_key: str
    schedule: str
    period_start: datetime
    via: str
    unit_count: int
    overlap_decision: str
    overlap_with: str | None
    created_at: datetime
    released_at: datetime | None
    finished_at: datetime | None
    succeeded: int
    dead: int
    cancelled: int
    discarded: int
    outcome: str = "existing"

    @property
    def pending(self) -> int:
        done = self.succeeded + self.dead + self.cancelled + self.discarded
        return max(0, self.unit_count - done)

    def to_json(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return None if value is None else rfc3339.format(value)

        return {
            "run_key": self.run_key,
            "schedule": self.schedule,
            "period_start": iso(self.period_start),
            "via": self.via,
            "outcome": self.outcome,
            "overlap_decision": self.overlap_decision,
            "overlap_with": self.overlap_with,
            "created_at": iso(self.created_at),
            "released_at": iso(self.released_at),
            "finished_at": iso(self.finished_at),
            "units": {
                "total": self.unit_count,
                "succeeded": self.succeeded,
                "dead": self.dead,
                "cancelled": self.cancelled,
                "discarded": self.discarded,
                "pending": self.pending,
            },
        }


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One period to create a run for. `overlap` is the policy in force for this trigger."""

    schedule: str
    period_start: datetime
    run_key: str
    via: str
    overlap: str
    units_sql: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleState:
    enabled: bool
    checked_through: datetime
    tracked_since: datetime
    paused: bool = False
    paused_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class FinishedRun:
    """A run that has just finished (every unit terminal), with its unit counts."""

    run_key: str
    schedule: str
    period_start: datetime
    unit_count: int
    succeeded: int
    dead: int
    cancelled: int
    discarded: int


# Plans the on_finished follow-up of a finished run (None: its schedule has none).
PlanFollowUp = Callable[[FinishedRun], NewJob | None]


@dataclass(frozen=True, slots=True, order=True)
class MissedPeriod:
    period_start: datetime
    reason: str
    detected_at: datetime | None = None


def _state(row: asyncpg.Record) -> ScheduleState:
    return ScheduleState(
        row["enabled"], row["checked_through"], row["tracked_since"], row["paused"],
        row["paused_at"],
    )  # fmt: skip


def _receipt(row: asyncpg.Record, outcome: str) -> RunReceipt:
    return RunReceipt(**{k: row[k] for k in _RECEIPT_COLUMNS}, outcome=outcome)


_RECEIPT_COLUMNS = [f.name for f in dataclasses.fields(RunReceipt) if f.name != "outcome"]
_FINISHED_COLUMNS = [f.name for f in dataclasses.fields(FinishedRun)]


class RunRepository:
    """Reads and writes of runs and schedule accounting; the only cron code that sees SQL."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        jobs: JobRepository,
        *,
        unit_batch: int = 1000,
        after_unit_batch: AfterUnitBatch | None = None,
        follow_up: PlanFollowUp | None = None,
    ):
        self.pool = pool
        self._jobs = jobs
        self._unit_batch = unit_batch
        self._follow_up = follow_up
        # test seam: runs inside the trigger transaction after each batch of units
        self._after_unit_batch = after_unit_batch

    # creating runs ------------------------------------------------------------------------
    async def create_run(self, request: RunRequest, plan_jobs: PlanJobs) -> tuple[RunReceipt, int]:
        """Find or create the run of one period; return its receipt and the jobs created.

        Raise TriggerFailed (nothing committed) when the database or the fan-out fails, and
        SchedulePaused when a cron fire (`via` cron) finds its schedule paused."""
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(query("lock_schedule"), request.schedule)
                row = await conn.fetchrow(query("get_run"), request.run_key)
                if row is not None:
                    return _receipt(row, "existing"), 0
                if request.via == "cron" and await conn.fetchval(
                    query("schedule_paused"), request.schedule
                ):
                    raise SchedulePaused(f"schedule {request.schedule} is paused")
                created = await self._create_locked(conn, request, plan_jobs)
                row = await conn.fetchrow(query("get_run"), request.run_key)
                return _receipt(row, "created"), created
        except _DRIVER_ERRORS as exc:
            raise TriggerFailed(
                f"run {request.run_key} was not created (rolled back, safe to retry): "
                f"{_describe(exc)}"
            ) from exc

    async def _create_locked(
        self, conn: asyncpg.Connection, request: RunRequest, plan_jobs: PlanJobs
    ) -> int:
        created = await self._finish(conn, request.schedule)
        earlier = await conn.fetchval(
            query("unfinished_before"), request.schedule, request.period_start
        )
        decision = "none" if earlier is None else _DECISIONS[request.overlap]
        jobs: list[NewJob] = []
        if decision != "skipped":
            values = None
            if request.units_sql is not None:
                values = [r[0] for r in await conn.fetch(request.units_sql)]
            jobs = plan_jobs(values)
        queued = [dataclasses.asdict(j) for j in jobs] if decision == "queued" else None
        inserted = await conn.fetchval(
            query("insert_run"), request.run_key, request.schedule, request.period_start,
            request.via, len(jobs), decision, earlier, queued,
        )  # fmt: skip
        if inserted is None:  # impossible under the lock; fail loudly rather than double
            raise TriggerFailed(f"run {request.run_key} appeared concurrently; retry the trigger")
        if queued is not None:
            return created
        created += await self._enqueue(conn, jobs)
        # a run without units is finished at once (and gets its follow-up in this transaction)
        return created + await self._finish(conn, request.schedule)

    async def _enqueue(self, conn: asyncpg.Connection, jobs: Sequence[NewJob]) -> int:
        created = 0
        for start in range(0, len(jobs), self._unit_batch):
            batch = jobs[start : start + self._unit_batch]
            results = await self._jobs.enqueue_many(batch, conn=conn)
            conflicts = [r.key for r in results if r.outcome == "conflict"]
            if conflicts:
                raise UnitConflict(
                    f"unit key {conflicts[0]!r} (and {len(conflicts) - 1} more) already names "
                    "a job with a different request; the run was not created"
                )
            created += sum(r.outcome == "created" for r in results)
            if self._after_unit_batch is not None:
                await self._after_unit_batch(start + len(batch))
        return created

    async def release_queued(self, schedule: str) -> tuple[list[str], int]:
        """Enqueue the units of queued runs whose earlier runs have all finished, oldest first;
        return the released run keys and the number of jobs created."""
        released: list[str] = []
        created = 0
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(query("lock_schedule"), schedule)
                while True:
                    created += await self._finish(conn, schedule)
                    row = await conn.fetchrow(query("first_queued_run"), schedule)
                    if row is None:
                        break
                    earlier = await conn.fetchval(
                        query("unfinished_before"), schedule, row["period_start"]
                    )
                    if earlier is not None:
                        break
                    jobs = [queued_job(item) for item in row["queued_jobs"]]
                    created += await self._enqueue(conn, jobs)
                    await conn.execute(query("release_run"), row["run_key"])
                    released.append(row["run_key"])
        except _DRIVER_ERRORS as exc:
            raise TriggerFailed(
                f"queued runs of {schedule} not released: {_describe(exc)}"
            ) from exc
        return released, created

    # finishing runs -----------------------------------------------------------------------
    @translate_unavailable
    async def finish_runs(self, schedule: str) -> int:
        """Finish the runs of `schedule` whose units are all terminal and enqueue their
        follow-ups; return the follow-up jobs created. Skipped (0) while another transaction
        holds the schedule's lock: a trigger in progress finishes runs itself, and the sweep
        comes back soon, so nothing waits behind a large fan-out."""
        async with self.pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(query("try_lock_schedule"), schedule):
                return 0
            return await self._finish(conn, schedule)

    async def _finish(self, conn: asyncpg.Connection, schedule: str) -> int:
        """Inside a transaction holding the schedule's lock: finish what is done, enqueue each
        finished run's follow-up; return the follow-up jobs created."""
        rows = await conn.fetch(query("finish_runs"), schedule)
        if not rows:
            return 0
        fault_point("run_finished_before_follow_up")
        finished = [FinishedRun(**{k: r[k] for k in _FINISHED_COLUMNS}) for r in rows]
        jobs = [job for run in finished if (job := self._plan_follow_up(run)) is not None]
        if not jobs:
            return 0
        results = await self._jobs.enqueue_many(jobs, conn=conn)
        for result in results:
            if result.outcome == "conflict":
                # Someone else's job holds the key (say, through the SQL door). The run stays
                # finished; the follow-up cannot be created under its key.
                log.error(
                    "cron run follow-up %s not enqueued: the key already names job %d with a "
                    "different request",
                    result.key, result.id,
                )  # fmt: skip
        return sum(r.outcome == "created" for r in results)

    def _plan_follow_up(self, run: FinishedRun) -> NewJob | None:
        return None if self._follow_up is None else self._follow_up(run)

    # reading runs (the status view: DatabaseUnavailable when the database cannot be reached)
    async def get(self, run_key: str) -> RunReceipt | None:
        row = await self.pool.fetchrow(query("get_run"), run_key)
        return None if row is None else _receipt(row, "existing")

    @translate_unavailable
    async def latest(self, schedule: str) -> RunReceipt | None:
        row = await self.pool.fetchrow(query("latest_run"), schedule)
        return None if row is None else _receipt(row, "existing")

    @translate_unavailable
    async def recent(self, schedule: str, limit: int) -> list[RunReceipt]:
        """The receipts of the schedule's latest `limit` periods, newest first."""
        rows = await self.pool.fetch(query("recent_runs"), schedule, limit)
        return [_receipt(row, "existing") for row in rows]

    @translate_unavailable
    async def retrying(self, run_keys: Sequence[str]) -> dict[str, int]:
        """Per run key: its unfinished units whose earlier attempt failed (absent: none)."""
        rows = await self.pool.fetch(query("runs_retrying"), list(run_keys))
        return {row["run_key"]: row["retrying"] for row in rows}

    @translate_unavailable
    async def count_queued(self, schedule: str) -> int:
        return int(await self.pool.fetchval(query("count_queued_runs"), schedule))

    @translate_unavailable
    async def run_periods_between(
        self, schedule: str, after: datetime, upto: datetime
    ) -> set[datetime]:
        rows = await self.pool.fetch(query("run_periods_between"), schedule, after, upto)
        return {r["period_start"] for r in rows}

    # accounting of periods ----------------------------------------------------------------
    @translate_unavailable
    async def ensure_state(self, schedule: str, enabled: bool, now: datetime) -> ScheduleState:
        row = await self.pool.fetchrow(query("ensure_schedule_state"), schedule, enabled, now)
        return _state(row)

    @translate_unavailable
    async def get_state(self, schedule: str) -> ScheduleState | None:
        row = await self.pool.fetchrow(query("get_schedule_state"), schedule)
        return None if row is None else _state(row)

    @translate_unavailable
    async def set_paused(
        self, schedule: str, enabled: bool, paused: bool, now: datetime
    ) -> ScheduleState:
        """Pause (from `now` on; an earlier pause keeps its start) or resume a schedule, under
        its lock: once this returns, no cron fire of any instance creates a run while paused."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(query("lock_schedule"), schedule)
            row = await conn.fetchrow(query("set_schedule_paused"), schedule, enabled, now, paused)
        return _state(row)

    @translate_unavailable
    async def advance_state(self, schedule: str, through: datetime, enabled: bool) -> None:
        await self.pool.execute(query("advance_schedule_state"), schedule, through, enabled)

    @translate_unavailable
    async def record_missed(
        self, schedule: str, missed: Sequence[MissedPeriod]
    ) -> list[MissedPeriod]:
        """Record missed periods; return only those not recorded before (by any instance)."""
        if not missed:
            return []
        rows = await self.pool.fetch(
            query("record_missed"),
            schedule,
            [m.period_start for m in missed],
            [m.reason for m in missed],
        )
        return sorted(MissedPeriod(r["period_start"], r["reason"]) for r in rows)

    @translate_unavailable
    async def outstanding_missed(
        self, schedule: str, limit: int
    ) -> tuple[int, datetime | None, list[MissedPeriod]]:
        """Missed periods still without a run: the total, the oldest, and the newest `limit`."""
        rows = await self.pool.fetch(query("outstanding_missed"), schedule, limit)
        if not rows:
            return 0, None, []
        periods = [MissedPeriod(r["period_start"], r["reason"], r["detected_at"]) for r in rows]
        return rows[0]["total"], rows[0]["oldest"], periods


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncpg.PostgresError):
        hint = getattr(exc, "hint", None)
        return f"{exc}" + (f" ({hint})" if hint else "")
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def queued_job(item: dict[str, Any]) -> NewJob:
    """A unit of a queued run as stored (JSON): its time to live is RFC 3339 text there."""
    expires_at = item.get("expires_at")
    if isinstance(expires_at, str):
        item = {**item, "expires_at": datetime.fromisoformat(expires_at)}
    return NewJob(**item)
