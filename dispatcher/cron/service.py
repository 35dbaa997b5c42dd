"""The cron service: fires configured schedules on APScheduler and turns each scheduled period
into exactly one run (a receipt plus one job per unit), however many instances fire it.

Every path that creates runs goes through `trigger(name, period_start)`: the cron fire, a late
fire within `misfire_grace_s` after a restart, `catch_up`, and the HTTP trigger. The run key is
derived from the period's scheduled start, never from the clock at fire time, and the receipt is
unique per key, so a repeat of any of them converges on the same run and the same unit keys.

Accounting: for each schedule the database remembers up to which instant every period has been
accounted for. On start, on each fire and on each housekeeping tick the service walks the
periods since then: a period without a run that is still within `misfire_grace_s` fires late
(only the latest one; earlier ones are `coalesced`), older ones are recorded as missed
(`not_fired` or `disabled`), counted in `dispatcher_cron_missed_periods`, logged, and listed by
`status()` until an operator creates their runs with `catch_up`. Nothing is backfilled silently.

Pause: an operator may pause a schedule at runtime (`pause`/`resume`, stored in the database, so
every instance honours it from the moment it commits, across restarts). A paused schedule fires
nothing; its periods are recorded as missed with reason `paused`. Explicit triggers and catch-up
still create runs (the operator asked for those periods). `catch_up`/`trigger` have dry runs
(`plan_catch_up`, `plan_trigger`) that list what they would create and create nothing.

Follow-ups: a schedule with `on_finished` gets one follow-up job per finished run, enqueued in
the transaction that marks the run finished (see dispatcher.db.runs); a sweep every
`finish_interval_s` finds the runs whose last unit became terminal.

Timing: the fires, the housekeeping tick and the run-finished sweep are jobs on the daemon's
one timing engine (dispatcher.runtime.timing); each fire arms the next period's. Timing follows the
process clock; identity never depends on it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import TYPE_CHECKING, Any

from dispatcher.core import rfc3339
from dispatcher.cron.expression import PeriodError, query_units, run_key
from dispatcher.cron.periods import (
    MAX_LOOKBACK,
    MAX_RECORDED_MISSED,
    STATUS_MISSED_SHOWN,
    Missed,
    PlannedRun,
    as_utc,
    catch_up_hint,
    catch_up_periods,
    check_period,
    missed_reason,
    status_entry,
)
from dispatcher.cron.schedules import QueryFanout, ScheduleSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.db.runs import (
    AfterUnitBatch,
    FinishedRun,
    MissedPeriod,
    RunReceipt,
    RunRepository,
    RunRequest,
    SchedulePaused,
    ScheduleState,
    TriggerFailed,
)
from dispatcher.errors import DispatcherError
from dispatcher.model import NewJob
from dispatcher.observability import metrics
from dispatcher.runtime.lifecycle import Service
from dispatcher.runtime.timing import TimingEngine

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "CronService",
    "PeriodError",
    "PlannedRun",
    "RunReceipt",
    "TriggerFailed",
    "UnknownSchedule",
]

log = logging.getLogger(__name__)


class UnknownSchedule(DispatcherError, LookupError):
    """No schedule of that name is configured."""


class CronService(Service):
    """Fires the configured schedules on the timing engine and owns the runs they create.

    `start()` accounts for the periods that passed while no instance ran, then arms one
    engine job per enabled schedule at its next period start, a housekeeping tick and (with
    `on_finished` schedules) the run-finished sweep; `stop()` is idempotent, removes them, and
    waits (bounded by the engine) for fires in progress. Without an engine the service still
    triggers, catches up and reports (the CLI), but cannot start.
    """

    name = "cron"

    def __init__(
        self,
        pool: asyncpg.Pool,
        repo: JobRepository,
        schedules: list[ScheduleSettings],
        *,
        timing: TimingEngine | None = None,
        on_enqueued: Callable[[], None] | None = None,
        clock: Callable[[], datetime] | None = None,
        housekeeping_s: float = 30.0,
        unit_batch: int = 1000,
        after_unit_batch: AfterUnitBatch | None = None,
        finish_interval_s: float = 1.0,
    ):
        self._schedules = {s.name: s for s in schedules}
        self._runs = RunRepository(
            pool,
            repo,
            unit_batch=unit_batch,
            after_unit_batch=after_unit_batch,
            follow_up=self._follow_up_job,
        )
        self._finish_interval_s = finish_interval_s
        self._timing = timing
        self._on_enqueued = on_enqueued
        self._clock = clock or (lambda: datetime.now(UTC))
        self._housekeeping_s = housekeeping_s
        self._jobs: list[str] = []

    # lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Account for periods missed while down (late fires within grace), then arm the
        engine's jobs."""
        if self._timing is None:
            raise DispatcherError("the cron service needs a timing engine to start")
        self._stopping = False
        await self.run_once()
        for s in self._schedules.values():
            if s.enabled:
                self._arm(s.name, datetime.now(UTC) - timedelta(microseconds=1))
        if self._schedules:
            self._every("cron-housekeeping", self._housekeeping_s, self.run_once)
        if any(s.on_finished is not None for s in self._schedules.values()):
            # follow-ups promptly after a run's last unit ends (housekeeping also finishes runs)
            self._every("cron-finish", self._finish_interval_s, self.finish_runs)
        enabled = sum(s.enabled for s in self._schedules.values())
        log.info("cron: %d schedules (%d enabled)", len(self._schedules), enabled)

    async def stop(self) -> None:
        """Idempotent: no new fires, fires in progress finish (or are cancelled at the engine's
        timeout; a cancelled trigger rolls back and converges when fired again)."""
        self._stopping = True
        jobs, self._jobs = self._jobs, []
        if self._timing is not None and jobs:
            await self._timing.cancel(*jobs)

    def job_name(self, name: str) -> str:
        """The engine job that fires schedule `name`."""
        return f"cron:{name}"

    def _every(self, job: str, interval_s: float, work: Callable[[], Any]) -> None:
        assert self._timing is not None
        self._timing.every(job, interval_s, work, finish_on_stop=True)
        self._jobs.append(job)

    def _arm(self, name: str, after: datetime) -> None:
        """Arm schedule `name`'s job at its first period start after `after`."""
        when = self._schedules[name].schedule().next_after(after)
        if when is None or self._timing is None or self._stopping:
            return
        job = self.job_name(name)
        self._timing.at(job, when, lambda: self._fire_and_arm(name))
        if job not in self._jobs:
            self._jobs.append(job)

    async def _fire_and_arm(self, name: str) -> None:
        """The engine's call at a period start: fire, then arm the next period start after
        now (periods passed meanwhile are the accounting's: fired late within grace, or
        recorded missed)."""
        try:
            await self.fire(name)
        except Exception as exc:
            log.error("cron %s: fire failed, retrying at the next tick: %s", name, exc)
        finally:
            self._arm(name, datetime.now(UTC))

    def names(self) -> list[str]:
        return list(self._schedules)

    # creating runs ------------------------------------------------------------------------
    async def trigger(self, name: str, period_start: datetime, *, via: str = "api") -> RunReceipt:
        """Find or create the run of one period (idempotent). Raise UnknownSchedule,
        PeriodError (not a period start of the schedule, or in the future) or TriggerFailed.

        An explicit trigger (`api`, `catch_up`) under the `skip` policy queues behind an
        unfinished earlier run instead of skipping: the operator asked for this period."""
        s = self._schedule(name)
        period = check_period(s, period_start, self._clock())
        overlap = s.overlap if via == "cron" or s.overlap != "skip" else "queue"
        request = RunRequest(
            schedule=s.name,
            period_start=period,
            run_key=run_key(s.name, period),
            via=via,
            overlap=overlap,
            units_sql=s.fanout.sql if isinstance(s.fanout, QueryFanout) else None,
        )
        try:
            receipt, created = await self._runs.create_run(request, self._planner(s, period))
        except SchedulePaused:
            raise
        except Exception:
            metrics.CRON_RUNS.labels(s.name, "failed").inc()
            raise
        self._count_run(receipt)
        if created:
            self._notify()
        if overlap == "queue":
            await self._release(s.name)
        return receipt

    async def catch_up(self, name: str, start: datetime, end: datetime) -> list[RunReceipt]:
        """Create the runs of every period starting in [start, end] that has none yet (the
        receipts of all of them, `created` or `existing`); refuse a range reaching the future."""
        periods = catch_up_periods(self._schedule(name), start, end, self._clock())
        receipts = [await self.trigger(name, p, via="catch_up") for p in periods]
        created = sum(r.outcome == "created" for r in receipts)
        log.info(
            "cron catch-up of %s from %s to %s: %d periods, %d runs created",
            name, rfc3339.format(start), rfc3339.format(end), len(periods), created,
        )  # fmt: skip
        return receipts

    async def plan_catch_up(self, name: str, start: datetime, end: datetime) -> list[PlannedRun]:
        """The dry run of `catch_up`: the same checks and periods, nothing created."""
        s = self._schedule(name)
        return await self._plan(s, catch_up_periods(s, start, end, self._clock()))

    async def plan_trigger(self, name: str, period_start: datetime) -> PlannedRun:
        """The dry run of `trigger`: the same checks, nothing created."""
        s = self._schedule(name)
        (planned,) = await self._plan(s, [check_period(s, period_start, self._clock())])
        return planned

    async def _plan(self, s: ScheduleSettings, periods: list[datetime]) -> list[PlannedRun]:
        if not periods:
            return []
        after = periods[0] - timedelta(microseconds=1)
        have = await self._runs.run_periods_between(s.name, after, periods[-1])
        static = s.static_units()
        units = None if static is None else len(static)  # a query's units: known when created
        return [
            PlannedRun(
                run_key(s.name, p),
                p,
                "existing" if p in have else "would_create",
                None if p in have else units,
            )
            for p in periods
        ]

    # pausing ------------------------------------------------------------------------------
    async def pause(self, name: str, now: datetime | None = None) -> dict[str, Any]:
        """Pause a schedule on every instance (idempotent: a pause keeps its start); return
        its status. Its periods are recorded missed (`paused`) until it is resumed."""
        s = self._schedule(name)
        now = as_utc(now or self._clock(), "now")
        state = await self._runs.set_paused(s.name, s.enabled, True, now)
        metrics.SCHEDULE_PAUSED.labels(s.name).set(1)
        log.warning("cron %s paused (since %s)", s.name, rfc3339.format(state.paused_at or now))
        return await self._status_of(s, now)

    async def resume(self, name: str, now: datetime | None = None) -> dict[str, Any]:
        """Resume a schedule (idempotent); return its status. The periods that passed while it
        was paused are recorded missed (`paused`) first, so none fires late or silently."""
        s = self._schedule(name)
        now = as_utc(now or self._clock(), "now")
        state = await self._runs.get_state(s.name)
        if state is not None and state.paused:
            await self._account(s, now)
        await self._runs.set_paused(s.name, s.enabled, False, now)
        metrics.SCHEDULE_PAUSED.labels(s.name).set(0)
        if state is not None and state.paused:
            log.warning(
                "cron %s resumed (paused since %s)", s.name, rfc3339.format(state.paused_at or now)
            )
        return await self._status_of(s, now)

    # follow-ups ---------------------------------------------------------------------------
    async def finish_runs(self) -> int:
        """Finish the runs whose units are all terminal, for every schedule with on_finished,
        enqueueing their follow-ups; return how many were created. Failures are logged and
        retried at the next sweep (nothing was committed)."""
        created = 0
        for s in self._schedules.values():
            if s.on_finished is None:
                continue
            try:
                created += await self._runs.finish_runs(s.name)
            except Exception as exc:
                log.error("cron %s: finishing runs failed, retrying next sweep: %s", s.name, exc)
        if created:
            self._notify()
        return created

    def _follow_up_job(self, run: FinishedRun) -> NewJob | None:
        s = self._schedules.get(run.schedule)
        if s is None or s.on_finished is None:
            return None
        counts = {
            "succeeded": run.succeeded,
            "dead": run.dead,
            "discarded": run.discarded,
            "cancelled": run.cancelled,
        }
        log.info(
            "cron run %s finished (%d units: %s); follow-up %s:finished",
            run.run_key, run.unit_count, ", ".join(f"{n} {k}" for k, n in counts.items()),
            run.run_key,
        )  # fmt: skip
        return s.follow_up_job(run.run_key, run.period_start, run.unit_count, counts)

    async def fire(self, name: str, now: datetime | None = None) -> RunReceipt | None:
        """Account for the periods of one schedule up to `now` (default: the clock): fire the
        latest unrun one if still within grace, record older ones as missed. The APScheduler
        job calls this at each period start; tests call it with an injected time."""
        return await self._account(self._schedule(name), as_utc(now or self._clock(), "now"))

    async def run_once(self, now: datetime | None = None) -> dict[str, RunReceipt | None]:
        """Housekeeping for every schedule: release queued runs whose turn came, account for
        periods (late fires within grace, missed ones recorded). Failures are logged per
        schedule and retried at the next tick."""
        now = as_utc(now or self._clock(), "now")
        fired: dict[str, RunReceipt | None] = {}
        for s in self._schedules.values():
            try:
                await self._release(s.name)
                fired[s.name] = await self._account(s, now)
            except Exception as exc:
                log.error("cron %s: accounting failed, retrying next tick: %s", s.name, exc)
                fired[s.name] = None
        return fired

    # operator view ------------------------------------------------------------------------
    async def status(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """One entry per configured schedule: next fire time, last run receipt, missed periods."""
        now = as_utc(now or self._clock(), "now")
        return [await self._status_of(s, now) for s in self._schedules.values()]

    async def receipts(self, name: str, limit: int) -> list[RunReceipt]:
        """The run receipts of schedule `name`'s latest `limit` periods, newest first."""
        return await self._runs.recent(self._schedule(name).name, limit)

    async def _status_of(self, s: ScheduleSettings, now: datetime) -> dict[str, Any]:
        await self._runs.finish_runs(s.name)
        latest = await self._runs.latest(s.name)
        recorded_total, oldest, recorded = await self._runs.outstanding_missed(
            s.name, STATUS_MISSED_SHOWN
        )
        state = await self._runs.get_state(s.name)
        unrecorded = await self._unrecorded_missed(s, state, now) if state else []
        missed = Missed(
            recorded_total + len(unrecorded),
            sorted(recorded + unrecorded, reverse=True)[:STATUS_MISSED_SHOWN],
            catch_up_hint(s.name, recorded + unrecorded, oldest),
        )
        queued = await self._runs.count_queued(s.name)
        return status_entry(s, now, state, latest, queued, missed)

    async def _unrecorded_missed(
        self, s: ScheduleSettings, state: ScheduleState, now: datetime
    ) -> list[MissedPeriod]:
        """Periods past grace that no accounting has looked at yet (e.g. while disabled)."""
        since = max(state.checked_through, now - MAX_LOOKBACK)
        until = now - timedelta(seconds=s.misfire_grace_s)
        if until <= since:
            return []
        periods = list(islice(s.schedule().periods(since, until, include_start=False), 10_000))
        have = await self._runs.run_periods_between(s.name, since, until)
        return [
            MissedPeriod(p, missed_reason(s, state, p, within_grace=False))
            for p in periods
            if p not in have
        ]

    # internals ----------------------------------------------------------------------------
    def _schedule(self, name: str) -> ScheduleSettings:
        try:
            return self._schedules[name]
        except KeyError:
            known = ", ".join(sorted(self._schedules)) or "none configured"
            raise UnknownSchedule(f"no schedule {name!r} (known: {known})") from None

    @staticmethod
    def _planner(
        s: ScheduleSettings, period: datetime
    ) -> Callable[[list[Any] | None], list[NewJob]]:
        def plan(values: list[Any] | None) -> list[NewJob]:
            if values is None:
                units = s.static_units() or []
            else:
                limit = s.fanout.max_units if isinstance(s.fanout, QueryFanout) else 0
                units = query_units(values, limit=limit)
            return s.jobs_for(period, units)

        return plan

    async def _account(self, s: ScheduleSettings, now: datetime) -> RunReceipt | None:
        state = await self._runs.ensure_state(s.name, s.enabled, now)
        metrics.SCHEDULE_PAUSED.labels(s.name).set(1 if state.paused else 0)
        since = max(state.checked_through, now - MAX_LOOKBACK)
        have = await self._runs.run_periods_between(s.name, since, now)
        # the newest periods without a run (bounded: a long outage is summarised, not listed)
        missing: deque[datetime] = deque(maxlen=MAX_RECORDED_MISSED + 1)
        total = 0
        for period in s.schedule().periods(since, now, include_start=False):
            if period not in have:
                missing.append(period)
                total += 1
        grace = timedelta(seconds=s.misfire_grace_s)
        fire_period = None
        # A period passed while the schedule was disabled (as last configured) or paused (by an
        # operator) is never fired.
        live = s.enabled and state.enabled and not state.paused
        if live and missing and now - missing[-1] <= grace:
            fire_period = missing.pop()
            total -= 1
        missed = [MissedPeriod(p, missed_reason(s, state, p, now - p <= grace)) for p in missing]
        if total > len(missed):
            log.warning(
                "cron %s: %d older periods without a run are not recorded individually",
                s.name, total - len(missed),
            )  # fmt: skip
        await self._report_missed(s, await self._runs.record_missed(s.name, missed))
        receipt = None
        through = now
        if fire_period is not None:
            try:
                receipt = await self.trigger(s.name, fire_period, via="cron")
            except SchedulePaused:
                # paused after this pass read the state: the period passed while paused
                paused = [MissedPeriod(fire_period, "paused")]
                await self._report_missed(s, await self._runs.record_missed(s.name, paused))
            except Exception:
                # the fire did not happen: the next fire or tick retries it (or records it
                # missed once it is past grace)
                through = fire_period - timedelta(microseconds=1)
                await self._runs.advance_state(s.name, through, s.enabled)
                raise
        await self._runs.advance_state(s.name, through, s.enabled)
        return receipt

    async def _report_missed(self, s: ScheduleSettings, new: list[MissedPeriod]) -> None:
        if not new:
            return
        metrics.CRON_MISSED.labels(s.name).inc(len(new))
        reasons = sorted({m.reason for m in new})
        log.warning(
            "cron %s: %d period(s) missed (%s), first %s, last %s; not backfilled: %s",
            s.name, len(new), ", ".join(reasons), rfc3339.format(new[0].period_start),
            rfc3339.format(new[-1].period_start), catch_up_hint(s.name, new),
        )  # fmt: skip

    async def _release(self, name: str) -> None:
        released, created = await self._runs.release_queued(name)
        for key in released:
            log.info("cron run %s released (queued behind an earlier run)", key)
        if created:
            self._notify()

    def _count_run(self, receipt: RunReceipt) -> None:
        if receipt.outcome == "existing":
            metrics.CRON_RUNS.labels(receipt.schedule, "existing").inc()
            return
        outcome = {"skipped": "skipped", "queued": "queued"}.get(
            receipt.overlap_decision, "created"
        )
        metrics.CRON_RUNS.labels(receipt.schedule, outcome).inc()
        log.info(
            "cron run %s %s via %s: %d units, overlap %s%s",
            receipt.run_key, outcome, receipt.via, receipt.unit_count, receipt.overlap_decision,
            f" with {receipt.overlap_with}" if receipt.overlap_with else "",
        )  # fmt: skip

    def _notify(self) -> None:
        if self._on_enqueued is not None:
            try:
                self._on_enqueued()
            except Exception as exc:  # a wake-up is an optimisation; the due-scan covers it
                log.warning("cron: on_enqueued hook failed: %s", exc)
