"""A parsed cron expression written out in words, for the console and the schedule status
(`0 2 * * 1-5` reads "at 02:00, Monday to Friday").

It reads the parsed value sets, not the text, so `*/15`, `0,15,30,45` and `0-59/15` read alike.
The wording follows the crontab rule the schedule fires by: when both day-of-month and
day-of-week are restricted, either one matching is enough ("or"). Times are wall-clock times
in the schedule's zone; the caller names the zone."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dispatcher.cron.expression import CronSchedule

_MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
# Past this many hour-and-minute combinations the times are described by their fields instead
# of listed one by one.
MAX_LISTED_TIMES = 6


def describe(schedule: CronSchedule) -> str:
    """The schedule's fire times in words, e.g. "every 15 minutes, Monday to Friday"."""
    parts = [_times(schedule.minutes, schedule.hours)]
    days = _days(schedule)
    if days:
        parts.append(days)
    elif "every" not in parts[0]:  # listed times: say they repeat daily
        parts.append("every day")
    if len(schedule.months) < 12:
        parts.append("in " + _spans(sorted(schedule.months), lambda m: _MONTH_NAMES[m - 1]))
    return ", ".join(parts)


def _times(minutes: tuple[int, ...], hours: tuple[int, ...]) -> str:
    every_hour = len(hours) == 24
    minute_step = _step(minutes, 60)
    if every_hour and minute_step == 1:
        return "every minute"
    if every_hour and minute_step is not None:
        return f"every {minute_step} minutes"
    if len(minutes) * len(hours) <= MAX_LISTED_TIMES:
        return "at " + _join([f"{h:02d}:{m:02d}" for h in hours for m in minutes])
    hour_step = _step(hours, 24)
    if len(minutes) == 1:
        at_minute = f"at minute {minutes[0]}"
    elif minute_step is not None:
        at_minute = f"every {minute_step} minutes" if minute_step > 1 else "every minute"
    else:
        at_minute = "at minutes " + _spans(minutes, str)
    if every_hour:
        return f"{at_minute} of every hour"
    if hour_step is not None:
        return f"{at_minute} of every {hour_step} hours (from 00:00)"
    return f"{at_minute} of hours " + _spans(hours, lambda h: f"{h:02d}")


def _days(schedule: CronSchedule) -> str:
    month_days = "" if len(schedule.days) == 31 else _month_days(sorted(schedule.days))
    # Monday first, so a weekend reads "Saturday and Sunday" and 1-5 "Monday to Friday"; but
    # Sunday first when Saturday is not with it, so 0-2 reads "Sunday to Tuesday".
    monday_first = 6 in schedule.weekdays or 0 not in schedule.weekdays
    ordered = sorted(schedule.weekdays, key=lambda d: (d - 1) % 7 if monday_first else d)
    week_days = "" if len(ordered) == 7 else _spans(ordered, _DAY_NAMES.__getitem__, week=True)
    if schedule.day_star or schedule.weekday_star:
        return month_days or week_days  # the other field is '*': only this one restricts
    return f"{month_days} or on {week_days}"


def _month_days(days: list[int]) -> str:
    label = "day" if len(days) == 1 else "days"
    return f"on {label} {_spans(days, str)} of the month"


def _step(values: tuple[int, ...], size: int) -> int | None:
    """The step of values that are 0, s, 2s, ... up to the end of the field, else None."""
    if not values or values[0] != 0:
        return None
    step = values[1] - values[0] if len(values) > 1 else size
    if list(values) == list(range(0, size, step)) and size % step == 0 and step < size:
        return step
    return None


def _spans(values: Iterable[int], name: Callable[[int], str], *, week: bool = False) -> str:
    """Runs of consecutive values as "a to b", joined: 1,2,3,5 -> "1 to 3 and 5". In a week
    Sunday follows Saturday."""
    runs: list[list[int]] = []
    for value in values:
        follows = runs and (
            value == runs[-1][-1] + 1 or (week and runs[-1][-1] == 6 and value == 0)
        )
        if follows:
            runs[-1].append(value)
        else:
            runs.append([value])
    words: list[str] = []
    for run in runs:
        if len(run) > 2:
            words.append(f"{name(run[0])} to {name(run[-1])}")
        else:
            words.extend(name(v) for v in run)
    return _join(words)


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
