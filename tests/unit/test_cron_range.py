"""Cron arithmetic at the ends of Python's calendar (years 1 and 9999): no OverflowError, ever.
An instant that cannot be expressed in UTC is a PeriodError; days that cannot be represented
have no fire times, so the search simply ends there."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from itertools import islice

import pytest

from dispatcher.core.rfc3339 import format as rfc3339
from dispatcher.cron.expression import (
    EARLIEST_INSTANT,
    LATEST_INSTANT,
    PeriodError,
    parse_cron,
)

ZONES = ["UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago", "Europe/Berlin"]
LAST_HOUR = datetime(9999, 12, 31, 23, 30, tzinfo=UTC)
FIRST_HOUR = datetime(1, 1, 1, 0, 30, tzinfo=UTC)


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("expression", ["0 * * * *", "30 2 * * *", "0 0 29 2 *", "0 0 * * mon"])
def test_the_last_hour_of_the_calendar_has_no_next_period(zone: str, expression: str) -> None:
    schedule = parse_cron(expression, zone)
    assert schedule.next_after(LAST_HOUR) is None
    latest = schedule.latest_at_or_before(LAST_HOUR)
    assert latest is None or latest <= LAST_HOUR
    assert isinstance(schedule.is_period_start(LAST_HOUR), bool)
    assert isinstance(schedule.describe_near(LAST_HOUR), str)
    assert list(schedule.periods(LAST_HOUR - timedelta(days=2), LAST_HOUR)) == sorted(
        set(schedule.periods(LAST_HOUR - timedelta(days=2), LAST_HOUR))
    )


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("expression", ["0 * * * *", "30 2 * * *", "0 0 1 1 *"])
def test_the_first_hour_of_the_calendar_has_no_earlier_period(zone: str, expression: str) -> None:
    schedule = parse_cron(expression, zone)
    earlier = schedule.latest_at_or_before(FIRST_HOUR)
    assert earlier is None or earlier <= FIRST_HOUR
    later = schedule.next_after(FIRST_HOUR)
    assert later is not None and later > FIRST_HOUR
    assert isinstance(schedule.is_period_start(FIRST_HOUR), bool)
    found = list(islice(schedule.periods(FIRST_HOUR, FIRST_HOUR + timedelta(days=3)), 100))
    assert found == sorted(found) and all(t >= FIRST_HOUR for t in found)


@pytest.mark.parametrize(
    "instant",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
        datetime(9999, 12, 31, 23, 59, tzinfo=timezone(-timedelta(hours=12))),
    ],
)
def test_an_instant_outside_the_utc_calendar_is_a_period_error(instant: datetime) -> None:
    schedule = parse_cron("0 * * * *")
    with pytest.raises(PeriodError, match="out of range"):
        schedule.is_period_start(instant)
    with pytest.raises(ValueError, match="out of range"):  # rfc3339.TimeError
        rfc3339(instant)


def test_the_shared_bounds() -> None:
    assert rfc3339(EARLIEST_INSTANT) == "2000-01-01T00:00:00Z"
    assert rfc3339(LATEST_INSTANT) == "9999-12-31T23:59:59Z"
    # the driver sends datetime.max as 'infinity': the last accepted instant is before it
    assert datetime.max.replace(tzinfo=UTC) > LATEST_INSTANT
