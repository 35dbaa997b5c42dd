"""Which periods of a schedule an operator may name, and how the cron service reports them.

Pure functions (no database, no clock of their own): the checks of a period start and of a
catch-up range, the reason a period was missed, the command that catches missed periods up,
and the operator view of one schedule. `CronService` (dispatcher.cron.service)
calls them with the state it read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from dispatcher.core import rfc3339
from dispatcher.cron.describe import describe
from dispatcher.cron.expression import EARLIEST_INSTANT, CronSchedule, PeriodError
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.db.runs import MissedPeriod, RunReceipt, ScheduleState

# Periods further back than this are neither enumerated nor reported (a schedule that was off
# for years does not make the daemon walk every minute of them).
MAX_LOOKBACK = timedelta(days=366)
MAX_RECORDED_MISSED = 10_000
MAX_CATCH_UP_PERIODS = 1000
# A period start may lie this far ahead of this process's clock (the caller's clock may lead).
FUTURE_TOLERANCE = timedelta(seconds=60)
STATUS_MISSED_SHOWN = 20


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """What a trigger or catch-up would do for one period (a dry run): create its run
    (`would_create`, with the unit count when the fan-out is static) or find it `existing`."""

    run_key: str
    period_start: datetime
    outcome: str
    units: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_key": self.run_key,
            "period_start": rfc3339.format(self.period_start),
            "outcome": self.outcome,
            "units": self.units,
        }


def as_utc(value: datetime, what: str) -> datetime:
    try:
        return rfc3339.utc(value)
    except rfc3339.TimeError as exc:
        raise PeriodError(f"{what}: {exc}") from None


def check_not_too_early(instant: datetime, what: str) -> None:
    """Periods start no earlier than due times may be (the same bound at every door)."""
    if instant < EARLIEST_INSTANT:
        raise PeriodError(
            f"{what} is before {rfc3339.format(EARLIEST_INSTANT)}, the earliest time the "
            "dispatcher accepts"
        )


def check_period(s: ScheduleSettings, period_start: datetime, now: datetime) -> datetime:
    """`period_start` in UTC if it is a period start of `s` that is not in the future."""
    period = as_utc(period_start, "period_start")
    check_not_too_early(period, f"period {rfc3339.format(period)} of {s.name!r}")
    if period > now + FUTURE_TOLERANCE:
        raise PeriodError(
            f"period {rfc3339.format(period)} of {s.name!r} is in the future; the schedule "
            "fires it when it is due"
        )
    schedule = s.schedule()
    if not schedule.is_period_start(period):
        raise PeriodError(
            f"{rfc3339.format(period)} is not a period start of schedule {s.name!r} "
            f"({s.cron!r} in {s.timezone}); nearest: {schedule.describe_near(period)}"
        )
    return period


def catch_up_periods(
    s: ScheduleSettings, start: datetime, end: datetime, now: datetime
) -> list[datetime]:
    """The period starts of `s` in [start, end], refusing a range that is reversed, reaches
    the future or holds more than MAX_CATCH_UP_PERIODS."""
    start, end = as_utc(start, "from"), as_utc(end, "to")
    if end < start:
        raise PeriodError(f"catch-up range ends ({rfc3339.format(end)}) before it starts")
    check_not_too_early(start, f"catch-up range start {rfc3339.format(start)}")
    if end > now + FUTURE_TOLERANCE:
        raise PeriodError(
            f"catch-up range ends in the future ({rfc3339.format(end)}); the schedule "
            "fires those periods itself"
        )
    periods = list(islice(s.schedule().periods(start, end), MAX_CATCH_UP_PERIODS + 1))
    if len(periods) > MAX_CATCH_UP_PERIODS:
        raise PeriodError(
            f"the range holds more than {MAX_CATCH_UP_PERIODS} periods of {s.name!r}; "
            "catch up in smaller ranges"
        )
    return periods


def missed_reason(
    s: ScheduleSettings, state: ScheduleState, period: datetime, within_grace: bool
) -> str:
    if not (s.enabled and state.enabled):
        return "disabled"
    # paused: a period that would have fired now, or one that started after the pause
    if state.paused and (within_grace or (state.paused_at and period > state.paused_at)):
        return "paused"
    return "coalesced" if within_grace else "not_fired"


def catch_up_hint(
    name: str, missed: list[MissedPeriod], oldest: datetime | None = None
) -> str | None:
    """The command that creates the runs of these missed periods (and of nothing else: every
    period between them either has a run or was recorded missed too)."""
    if not missed:
        return None
    first = min([m.period_start for m in missed] + ([oldest] if oldest else []))
    last = max(m.period_start for m in missed)
    return f"dispatcher catch-up {name} --from {rfc3339.format(first)} --to {rfc3339.format(last)}"


@dataclass(frozen=True, slots=True)
class Missed:
    """The missed periods of one schedule as the status shows them."""

    count: int
    shown: list[MissedPeriod]  # newest first, at most STATUS_MISSED_SHOWN
    hint: str | None


def status_entry(
    s: ScheduleSettings,
    now: datetime,
    state: ScheduleState | None,
    latest: RunReceipt | None,
    queued_runs: int,
    missed: Missed,
) -> dict[str, Any]:
    """The operator view of one schedule (GET /v1/schedules, the console, the CLI)."""
    paused = state is not None and state.paused
    schedule = s.schedule()
    next_fires = _next_fires(schedule, now) if s.enabled and not paused else []
    next_fire = next_fires[0]["at"] if next_fires else None
    return {
        "name": s.name,
        "cron": s.cron,
        "description": describe(schedule),
        "timezone": s.timezone,
        "enabled": s.enabled,
        "paused": paused,
        "paused_at": rfc3339.format(state.paused_at) if state and state.paused_at else None,
        "handler": s.handler,
        "queue": s.queue,
        "overlap": s.overlap,
        "misfire_grace_s": s.misfire_grace_s,
        "fanout": s.describe_fanout(),
        "on_finished": None if s.on_finished is None else s.on_finished.model_dump(),
        "next_fire_at": next_fire,
        "next_fires": next_fires,
        # the period a "trigger now" runs: the latest that has started
        "current_period": _formatted(schedule.latest_at_or_before(now)),
        "last_run": None if latest is None else latest.to_json(),
        "queued_runs": queued_runs,
        "missed": {
            "count": missed.count,
            "periods": [
                {"period_start": rfc3339.format(m.period_start), "reason": m.reason}
                for m in missed.shown
            ],
            "catch_up": missed.hint,
        },
    }


# How many upcoming fire times the status lists (each in UTC and in the schedule's zone).
NEXT_FIRES_SHOWN = 5


def _next_fires(schedule: CronSchedule, now: datetime) -> list[dict[str, str]]:
    """The next fire times after `now`: `at` in UTC, `local` the same instant on the
    schedule's wall clock with its offset (a schedule in Europe/Berlin reads in Berlin time)."""
    fires: list[dict[str, str]] = []
    instant: datetime | None = now
    while instant is not None and len(fires) < NEXT_FIRES_SHOWN:
        instant = schedule.next_after(instant)
        if instant is not None:
            local = instant.astimezone(schedule.zone).isoformat(timespec="seconds")
            fires.append({"at": rfc3339.format(instant), "local": local})
    return fires


def _formatted(instant: datetime | None) -> str | None:
    return None if instant is None else rfc3339.format(instant)
