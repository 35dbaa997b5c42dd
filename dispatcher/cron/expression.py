"""Cron arithmetic, free of I/O: the 5-field expression, period starts in a time zone, run keys,
and fan-out units.

Only the standard fields are accepted (numbers, month and weekday names, `*`, `a-b`, `/step`,
lists); extensions such as `L`, `W`, `#`, `?`, `H`, `@reboot` or a seconds field are refused
with a message naming the field. APScheduler 3.x's own crontab parser is deliberately not used:
it reads weekday 0 as Monday (crontab: Sunday) and fires a fixed-time schedule twice on a
fall-back day, so `CronSchedule` computes fire times itself and APScheduler only waits for them.

Daylight saving time (the rules ISC cron documents):

- A fixed-time schedule (hour field not starting with `*`) whose wall time falls in a
  spring-forward gap fires once, at the instant the clock would have shown that time without the
  jump (02:30 in a 02:00->03:00 gap fires at 03:30 new time). A wall time that occurs twice on a
  fall-back day fires once, at its first occurrence.
- An interval schedule (hour field `*` or `*/n`) follows elapsed time: wall times inside a gap do
  not exist and are skipped; wall times in the repeated hour fire in both occurrences.

A period is identified by its start instant; its run key is `<schedule>:<start in UTC, RFC 3339>`.

Instants near the ends of Python's calendar (years 1 and 9999) have no fire times: the arithmetic
stops there instead of overflowing, and an instant that cannot be converted is a PeriodError.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dispatcher.core import rfc3339
from dispatcher.errors import DispatcherError

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# Longest month length per month; February counts its leap day so Feb 29 stays reachable.
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# The longest gap between two fire times of a valid expression (Feb 29 on a given weekday is
# rarer, but with the crontab OR rule a restricted weekday always matches within a week).
_SEARCH_DAYS = 366 * 8 + 2
_STANDARD_TOKEN = re.compile(r"^[0-9a-z*,/-]+\Z")
# The instants the dispatcher accepts at every door, as due times (HTTP API, SQL door) and as
# period starts (cron triggers, catch-up): finite, from 2000-01-01T00:00:00Z through
# 9999-12-31T23:59:59Z, both included. The upper end is the last whole second Python can hold in
# UTC (drivers send datetime.max itself as 'infinity'). Migration 006 holds the same range in
# SQL: dispatcher.due_at_range().
EARLIEST_INSTANT = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
_EXTENSIONS = {
    "L": "'L' (last day of the month or last weekday) is a Quartz/cronie extension",
    "W": "'W' (nearest weekday) is a Quartz extension",
    "#": "'#' (nth weekday of the month) is a Quartz/cronie extension",
    "?": "'?' is a Quartz extension (standard cron uses '*')",
    "H": "'H' (hashed value) is a Jenkins extension",
}


class CronExpressionError(DispatcherError, ValueError):
    """A cron expression or time zone is not standard; the message says which part and why."""


class PeriodError(DispatcherError, ValueError):
    """An instant that is not a period start of the schedule, or a range that cannot be used."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    names_start: int = 0


_FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day-of-month", 1, 31),
    _Field("month", 1, 12, _MONTHS, 1),
    _Field("day-of-week", 0, 7, _WEEKDAYS, 0),
)


def _refuse(expression: str, message: str) -> CronExpressionError:
    return CronExpressionError(f"cron {expression!r}: {message}")


def _value(expression: str, spec: _Field, token: str) -> int:
    if token.isdigit():
        number = int(token)
    elif token in spec.names:
        number = spec.names.index(token) + spec.names_start
    else:
        allowed = f" or a name ({', '.join(spec.names)})" if spec.names else ""
        raise _refuse(expression, f"{spec.name} {token!r} is not a number{allowed}")
    if not spec.low <= number <= spec.high:
        raise _refuse(expression, f"{spec.name} {number} is out of range {spec.low}-{spec.high}")
    return number


def _parse_item(expression: str, spec: _Field, item: str) -> set[int]:
    base, slash, step_text = item.partition("/")
    if base == "*":
        low, high = spec.low, spec.high
    elif "-" in base:
        first, _, last = base.partition("-")
        low, high = _value(expression, spec, first), _value(expression, spec, last)
        if low > high:
            raise _refuse(
                expression,
                f"{spec.name} range {base!r} runs backwards; wrap-around ranges are not "
                f"standard, write it as two ranges joined by ','",
            )
    elif slash:
        raise _refuse(
            expression,
            f"{spec.name} {item!r}: a step needs '*' or a range before it (e.g. '*/{step_text}' "
            f"or '{base}-{spec.high}/{step_text}')",
        )
    else:
        single = _value(expression, spec, base)
        return {single}
    step = 1
    if slash:
        if not step_text.isdigit() or not 1 <= int(step_text) <= spec.high - spec.low + 1:
            raise _refuse(expression, f"{spec.name} step {step_text!r} must be 1 or more")
        step = int(step_text)
    return set(range(low, high + 1, step))


def _parse_field(expression: str, spec: _Field, text: str) -> frozenset[int]:
    lowered = text.lower()
    for mark in ("#", "?"):
        if mark in text:
            raise _refuse(
                expression, f"{spec.name} {text!r}: {_EXTENSIONS[mark]}, not standard cron"
            )
    for word in re.findall(r"[a-z]+", lowered):
        if word in spec.names:
            continue
        letter = next((m for m in "LWH" if m.lower() in word), None) if len(word) <= 2 else None
        if letter is not None:
            raise _refuse(
                expression, f"{spec.name} {text!r}: {_EXTENSIONS[letter]}, not standard cron"
            )
        allowed = f"names {', '.join(spec.names)}" if spec.names else "no names"
        raise _refuse(expression, f"{spec.name} {text!r}: {word!r} is not a name ({allowed})")
    if not _STANDARD_TOKEN.match(lowered):
        raise _refuse(
            expression,
            f"{spec.name} {text!r} has characters outside digits, names, '*', ',', '-', '/'",
        )
    values: set[int] = set()
    for item in lowered.split(","):
        if not item:
            raise _refuse(expression, f"{spec.name} {text!r} has an empty list item")
        values |= _parse_item(expression, spec, item)
    return frozenset(values)


def parse_cron(expression: str, timezone: str = "UTC") -> CronSchedule:
    """Validate a standard 5-field expression in an IANA zone; raise CronExpressionError."""
    return _parse_cached(expression, timezone)


@lru_cache(maxsize=256)
def _parse_cached(expression: str, timezone: str) -> CronSchedule:
    zone = load_zone(timezone)
    text = expression.strip()
    if text.startswith("@"):
        raise _refuse(
            expression,
            "'@' shortcuts (@reboot, @daily, ...) are not standard 5-field cron; write the "
            "fields, e.g. '0 0 * * *' for daily at midnight (@reboot has no equivalent)",
        )
    if not text.isascii():
        raise _refuse(expression, "only ASCII characters are allowed")
    parts = text.split()
    if len(parts) != 5:
        raise _refuse(
            expression,
            f"has {len(parts)} fields; standard cron has 5: minute hour day-of-month month "
            "day-of-week (no seconds or year field)",
        )
    minutes, hours, days, months, weekdays = (
        _parse_field(expression, spec, part) for spec, part in zip(_FIELDS, parts, strict=True)
    )
    schedule = CronSchedule(
        expression=" ".join(parts),
        zone=zone,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=days,
        months=months,
        weekdays=frozenset(d % 7 for d in weekdays),
        day_star=parts[2].startswith("*"),
        weekday_star=parts[4].startswith("*"),
        interval=parts[1].startswith("*"),
    )
    if schedule.day_star or not schedule.weekday_star:
        return schedule
    if not any(d <= _MONTH_DAYS[m - 1] for m in months for d in days):
        raise _refuse(expression, "day-of-month never occurs in the given months, it never fires")
    return schedule


def load_zone(name: str) -> ZoneInfo:
    """An IANA time zone by name; raise CronExpressionError for anything else."""
    if not name or name.startswith(("/", ".")) or not name.isascii():
        raise CronExpressionError(f"timezone {name!r} is not an IANA name like 'Europe/Berlin'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronExpressionError(
            f"timezone {name!r} is not a known IANA name (e.g. 'UTC', 'Europe/Berlin', "
            "'America/New_York')"
        ) from None


@dataclass(frozen=True)
class CronSchedule:
    """A parsed expression in a zone. Every instant it yields is timezone-aware UTC, whole
    minutes, strictly increasing; each is the start of one period."""

    expression: str
    zone: ZoneInfo
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    day_star: bool  # crontab rule: day-of-month and day-of-week OR together unless one is '*'
    weekday_star: bool
    interval: bool  # hour field starts with '*': follows elapsed time across DST changes
    _day_cache: dict[date, tuple[datetime, ...]] = field(
        default_factory=dict, repr=False, compare=False, hash=False
    )

    def matches_date(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        day_ok = day.day in self.days
        weekday_ok = day.isoweekday() % 7 in self.weekdays
        if self.day_star or self.weekday_star:
            return day_ok and weekday_ok
        return day_ok or weekday_ok

    def instants_on(self, day: date) -> tuple[datetime, ...]:
        """The fire instants (UTC) of the wall times on local date `day`, sorted."""
        cached = self._day_cache.get(day)
        if cached is not None:
            return cached
        found: tuple[datetime, ...] = ()
        if self.matches_date(day):
            try:
                found = self._resolve_day(day)
            except OverflowError:  # the first or last day of the calendar: not representable
                found = ()
        if len(self._day_cache) > 4096:
            self._day_cache.clear()
        self._day_cache[day] = found
        return found

    def _resolve_day(self, day: date) -> tuple[datetime, ...]:
        midnight = datetime.combine(day, time(), self.zone)
        next_midnight = datetime.combine(day + timedelta(days=1), time(), self.zone)
        offset = midnight.utcoffset()
        walls = [datetime.combine(day, time(h, m)) for h in self.hours for m in self.minutes]
        if offset is not None and offset == next_midnight.utcoffset() and _exists(midnight):
            # no transition this day: plain arithmetic
            return tuple((w - offset).replace(tzinfo=UTC) for w in walls)
        instants: set[datetime] = set()
        for wall in walls:
            instants.update(self._resolve(wall))
        return tuple(sorted(instants))

    def _resolve(self, wall: datetime) -> list[datetime]:
        first = wall.replace(tzinfo=self.zone, fold=0)
        second = wall.replace(tzinfo=self.zone, fold=1)
        first_utc, second_utc = first.astimezone(UTC), second.astimezone(UTC)
        if not _exists(first):  # in a spring-forward gap
            return [] if self.interval else [first_utc]
        if first_utc != second_utc:  # repeated on a fall-back day
            return [first_utc, second_utc] if self.interval else [first_utc]
        return [first_utc]

    def _local_date(self, instant: datetime) -> date:
        instant = _aware(instant)
        try:
            return instant.astimezone(self.zone).date()
        except OverflowError:  # at the calendar's edge; the callers look a day either side
            return instant.date()

    def next_after(self, instant: datetime) -> datetime | None:
        """The first period start strictly after `instant`."""
        instant = _aware(instant)
        local = self._local_date(instant)
        day = _shift(local, -1) or local
        best: datetime | None = None
        for offset in range(_SEARCH_DAYS):
            if (current := _shift(day, offset)) is None:
                break
            later = [t for t in self.instants_on(current) if t > instant]
            if later:
                candidate = later[0]
                best = candidate if best is None else min(best, candidate)
            if best is not None and offset >= 3:  # a neighbour day may still hold an earlier one
                return best
        return best

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """The last period start at or before `instant` (within the search horizon)."""
        instant = _aware(instant)
        local = self._local_date(instant)
        day = _shift(local, 1) or local
        best: datetime | None = None
        for offset in range(_SEARCH_DAYS):
            if (current := _shift(day, -offset)) is None:
                break
            earlier = [t for t in self.instants_on(current) if t <= instant]
            if earlier:
                candidate = earlier[-1]
                best = candidate if best is None else max(best, candidate)
            if best is not None and offset >= 3:
                return best
        return best

    def periods(
        self, start: datetime, end: datetime, *, include_start: bool = True
    ) -> Iterator[datetime]:
        """Period starts in [start, end] (or (start, end] without `include_start`), in order."""
        start, end = _aware(start), _aware(end)
        first, last = self._local_date(start), self._local_date(end)
        day: date | None = _shift(first, -1) or first
        last_day = _shift(last, 1) or last
        previous: datetime | None = None
        while day is not None and day <= last_day:
            for instant in self.instants_on(day):
                in_range = (instant >= start if include_start else instant > start) and (
                    instant <= end
                )
                if in_range and (previous is None or instant > previous):
                    previous = instant
                    yield instant
            day = _shift(day, 1)

    def is_period_start(self, instant: datetime) -> bool:
        instant = _aware(instant)
        day = self._local_date(instant)
        days = [d for d in (_shift(day, -1), day, _shift(day, 1)) if d is not None]
        return any(instant in self.instants_on(d) for d in days)

    def describe_near(self, instant: datetime) -> str:
        """Name the period starts around `instant` (for error messages)."""
        before = self.latest_at_or_before(instant)
        after = self.next_after(instant)
        known = [rfc3339.format(t) for t in (before, after) if t is not None]
        return " and ".join(known) if known else "none"


def _aware(instant: datetime) -> datetime:
    try:
        return rfc3339.utc(instant)
    except rfc3339.TimeError as exc:
        raise PeriodError(
            f"{exc}; times run from {rfc3339.format(EARLIEST_INSTANT)} through "
            f"{rfc3339.format(LATEST_INSTANT)}"
        ) from None


def _shift(day: date, days: int) -> date | None:
    """`day` moved by `days`, or None past the ends of the calendar (years 1 and 9999)."""
    try:
        return day + timedelta(days=days)
    except OverflowError:
        return None


def _exists(local: datetime) -> bool:
    """False for a wall time inside a spring-forward gap (it does not survive a round trip)."""
    back = local.astimezone(UTC).astimezone(local.tzinfo)
    return back.replace(tzinfo=None) == local.replace(tzinfo=None)


def run_key(schedule: str, period_start: datetime) -> str:
    """The identity of one period of one schedule, from its scheduled start (never the clock)."""
    return f"{schedule}:{rfc3339.format(_aware(period_start))}"


def unit_key(run: str, unit: str) -> str:
    return f"{run}:{unit}"


# fan-out units ------------------------------------------------------------------------------
UNIT_NAME = re.compile(r"^[ -~]{1,100}\Z")


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of a run: its name (the last part of the job key), extra payload fields and
    the tenant the job is claimed fairly under (None: no tenant)."""

    name: str
    fields: Mapping[str, Any]
    tenant: str | None = None


def range_units(count: int, low: int, high: int) -> list[Unit]:
    """`count` contiguous ranges [start, end) covering [low, high) as evenly as integers allow,
    named r00-of-16 ... r15-of-16."""
    if count < 1 or high - low < count:
        raise PeriodError(f"cannot split [{low}, {high}) into {count} non-empty ranges")
    width = max(2, len(str(count - 1)))
    bounds = [low + (high - low) * i // count for i in range(count + 1)]
    return [
        Unit(
            f"r{i:0{width}d}-of-{count}",
            {
                "range_start": bounds[i],
                "range_end": bounds[i + 1],
                "range_index": i,
                "range_count": count,
            },
        )
        for i in range(count)
    ]


def tenant_units(tenants: Sequence[str]) -> list[Unit]:
    return [Unit(t, {"tenant": t}, tenant=t) for t in tenants]


def query_units(values: Sequence[Any], *, limit: int) -> list[Unit]:
    """Units from the rows of a configured query (first column, as text)."""
    if len(values) > limit:
        raise PeriodError(f"the fan-out query returned {len(values)} units; the limit is {limit}")
    names = ["" if v is None else str(v) for v in values]
    bad = next((n for n in names if not UNIT_NAME.match(n)), None)
    if bad is not None:
        raise PeriodError(
            f"the fan-out query returned unit {bad!r}: a unit is 1-100 printable ASCII characters"
        )
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise PeriodError(f"the fan-out query returned unit {name!r} twice")
        seen.add(name)
    return [Unit(n, {}) for n in names]
