"""Run windows of a queue, free of I/O: parsed from text such as
`"Mon-Fri 18:00-07:00 Europe/Berlin"` and evaluated at an instant the caller passes in.

A window is a set of weekdays, a start and an end wall time (`HH:MM` or `HH:MM:SS`; the end may
be `24:00`)
and an IANA time zone (UTC when omitted). It opens on each listed local day at its start; when
the end is not after the start it crosses midnight and closes on the next day. A queue with
windows claims only while at least one is open; a queue without windows is always open.

Daylight saving time follows the cron module's rule for fixed wall times
(`dispatcher.cron.expression`): an edge whose wall time falls in a spring-forward gap happens
at the instant the clock would have shown it without the jump (02:30 in a 02:00->03:00 gap is
03:30 new time), and a wall time that occurs twice on a fall-back day is taken at its first
occurrence. So a window keeps its wall-clock edges; on a transition day it is an hour shorter
or longer in elapsed time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from dispatcher.cron.expression import CronExpressionError, load_zone
from dispatcher.errors import DispatcherError

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")  # ISO order: Monday is 1
_TIME = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?\Z")
_RANGE = re.compile(r"^(\S+)-(\S+)\Z")
_DAY_S = 86_400
MAX_WINDOWS = 50  # per queue: each claim loop evaluates them once a second while closed
# How far ahead a next opening is looked for: every window opens at least once a week.
_HORIZON_DAYS = 9
_EXAMPLE = "e.g. 'Mon-Fri 18:00-07:00 Europe/Berlin'"


class WindowError(DispatcherError, ValueError):
    """A run window that cannot be read; the message names the part that is wrong."""


@dataclass(frozen=True, slots=True)
class Window:
    """One run window. `days` holds ISO weekdays (1 = Monday) on which it opens; `start` and
    `end` are seconds after local midnight (end up to 86,400); end <= start crosses midnight."""

    text: str
    days: frozenset[int]
    start: int
    end: int
    zone: ZoneInfo

    def spans_near(self, instant: datetime) -> list[tuple[datetime, datetime]]:
        """The occurrences (open, close) in UTC that open within a few days around `instant`."""
        local_day = instant.astimezone(self.zone).date()
        spans = []
        for offset in range(-2, _HORIZON_DAYS):
            day = local_day + timedelta(days=offset)
            if day.isoweekday() not in self.days:
                continue
            end_day = day if self.end > self.start else day + timedelta(days=1)
            opens, closes = (
                _instant(day, self.start, self.zone),
                _instant(end_day, self.end, self.zone),
            )
            if closes > opens:
                spans.append((opens, closes))
        return spans


def parse_window(text: str) -> Window:
    """One window from `DAYS HH:MM-HH:MM [ZONE]`; DAYS is a comma list of day names or
    ranges (`Mon-Fri`, `Sat,Sun`, `Fri-Mon` wraps) or `daily`."""
    if not isinstance(text, str):
        raise WindowError(f"window {text!r}: must be text, {_EXAMPLE}")
    parts = text.split()
    if len(parts) not in (2, 3):
        raise WindowError(
            f"window {text!r}: expected 'DAYS HH:MM-HH:MM TIMEZONE' ({_EXAMPLE}), "
            f"found {len(parts)} part(s)"
        )
    days = _days(text, parts[0])
    start, end = _hours(text, parts[1])
    try:
        zone = load_zone(parts[2] if len(parts) == 3 else "UTC")
    except CronExpressionError as exc:
        raise WindowError(f"window {text!r}: {exc}") from None
    return Window(text, days, start, end, zone)


def parse_windows(texts: Sequence[str]) -> tuple[Window, ...]:
    """Every window of a queue; the first bad one raises WindowError."""
    if isinstance(texts, str):
        raise WindowError(f"windows must be a list of texts, not one text ({_EXAMPLE})")
    if len(texts) > MAX_WINDOWS:
        raise WindowError(f"at most {MAX_WINDOWS} windows per queue, not {len(texts)}")
    return tuple(_parse_cached(t) if isinstance(t, str) else parse_window(t) for t in texts)


@lru_cache(maxsize=1024)
def _parse_cached(text: str) -> Window:
    return parse_window(text)


@dataclass(frozen=True, slots=True)
class WindowState:
    """Whether a queue may claim at an instant: `open`, and the next change: `opens_at` when
    closed, `closes_at` when open (None: never, within the horizon, or no windows at all)."""

    open: bool
    opens_at: datetime | None
    closes_at: datetime | None


ALWAYS_OPEN = WindowState(True, None, None)


def window_state(windows: Sequence[Window], now: datetime) -> WindowState:
    """The state of a queue with `windows` at `now` (aware). Overlapping and adjoining
    windows count as one: `closes_at` is when the last of them that holds the queue open
    ends."""
    if not windows:
        return ALWAYS_OPEN
    now = now.astimezone(UTC)
    spans = sorted(span for w in windows for span in w.spans_near(now))
    merged: list[list[datetime]] = []
    for opens, closes in spans:
        if merged and opens <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], closes)
        else:
            merged.append([opens, closes])
    for opens, closes in merged:
        if opens <= now < closes:
            return WindowState(True, None, closes)
        if opens > now:
            return WindowState(False, opens, None)
    return WindowState(False, None, None)


def _instant(day: date, second: int, zone: ZoneInfo) -> datetime:
    """The UTC instant of wall time `second` on local `day` (24:00 is the next midnight), by
    the cron rule for fixed times: fold 0 is the first occurrence, and a wall time in a gap
    resolves with the offset before the jump (the time the clock would have shown)."""
    if second == _DAY_S:
        day, second = day + timedelta(days=1), 0
    hour, rest = divmod(second, 3600)
    wall = datetime.combine(day, time(hour, rest // 60, rest % 60), zone).replace(fold=0)
    return wall.astimezone(UTC)


def _days(text: str, spec: str) -> frozenset[int]:
    if spec.lower() in ("daily", "*"):
        return frozenset(range(1, 8))
    days: set[int] = set()
    for item in spec.split(","):
        bounds = _RANGE.match(item)
        if bounds is None:
            days.add(_day(text, item))
            continue
        first, last = _day(text, bounds.group(1)), _day(text, bounds.group(2))
        span = (last - first) % 7  # Fri-Mon wraps over the weekend
        days.update((first - 1 + i) % 7 + 1 for i in range(span + 1))
    return frozenset(days)


def _day(text: str, name: str) -> int:
    key = name.lower()[:3]
    if key not in _DAYS or len(name) not in (3, len(_full_name(key))):
        raise WindowError(
            f"window {text!r}: day {name!r} is not a weekday name (Mon, Tue, Wed, Thu, Fri, "
            "Sat, Sun, ranges like Mon-Fri, lists like Sat,Sun, or 'daily')"
        )
    return _DAYS.index(key) + 1


def _full_name(key: str) -> str:
    return {"mon": "monday", "tue": "tuesday", "wed": "wednesday", "thu": "thursday",
            "fri": "friday", "sat": "saturday", "sun": "sunday"}[key]  # fmt: skip


def _hours(text: str, spec: str) -> tuple[int, int]:
    bounds = spec.split("-")
    if len(bounds) != 2:
        raise WindowError(
            f"window {text!r}: hours {spec!r} must read HH:MM-HH:MM, e.g. 18:00-07:00"
        )
    start, end = _second(text, bounds[0], "start"), _second(text, bounds[1], "end")
    if start == _DAY_S:
        raise WindowError(f"window {text!r}: start 24:00 is not a time of day; use 00:00")
    if start == end:
        raise WindowError(
            f"window {text!r}: start and end are both {bounds[0]}; a whole day is 00:00-24:00"
        )
    return start, end


def _second(text: str, value: str, which: str) -> int:
    found = _TIME.match(value)
    if found is None:
        raise WindowError(f"window {text!r}: {which} {value!r} is not HH:MM (e.g. 07:30)")
    hour, minute, second = (int(g or 0) for g in found.groups())
    if minute > 59 or second > 59 or hour > 24 or (hour == 24 and minute + second != 0):
        raise WindowError(f"window {text!r}: {which} {value!r} is not a time from 00:00 to 24:00")
    return hour * 3600 + minute * 60 + second
