"""The cron describer (dispatcher.cron.describe): each expression shape in words, equal value
sets read alike, and the crontab OR rule where both day fields are restricted."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatcher.cron.describe import describe
from dispatcher.cron.expression import parse_cron
from dispatcher.cron.periods import NEXT_FIRES_SHOWN, _next_fires


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("0 2 * * *", "at 02:00, every day"),
        ("* * * * *", "every minute"),
        ("*/15 * * * 1-5", "every 15 minutes, Monday to Friday"),
        ("5 * * * *", "at minute 5 of every hour"),
        ("0 */2 * * *", "at minute 0 of every 2 hours (from 00:00)"),
        ("30 8,12,18 * * sat,sun", "at 08:30, 12:30 and 18:30, Saturday and Sunday"),
        ("0 0 1,15 * *", "at 00:00, on days 1 and 15 of the month"),
        (
            "0 9-17 * jan-mar mon-fri",
            "at minute 0 of hours 09 to 17, Monday to Friday, in January to March",
        ),
        ("0 0 1 6 *", "at 00:00, on day 1 of the month, in June"),
        ("0,30 9 * * 0-2", "at 09:00 and 09:30, Sunday to Tuesday"),
        ("0 0 * * 5-7", "at 00:00, Friday to Sunday"),
        ("7,9 */3 * * *", "at minutes 7 and 9 of every 3 hours (from 00:00)"),
        ("*/7 * * * *", "at minutes 0, 7, 14, 21, 28, 35, 42, 49 and 56 of every hour"),
        ("0-4 1 * * *", "at 01:00, 01:01, 01:02, 01:03 and 01:04, every day"),
        ("0 12 * * 1,3,5", "at 12:00, Monday, Wednesday and Friday"),
    ],
)
def test_expression_in_words(expression: str, words: str) -> None:
    assert describe(parse_cron(expression)) == words


def test_both_day_fields_restricted_read_as_either() -> None:
    # crontab fires when EITHER field matches; "and" would promise far fewer runs
    assert describe(parse_cron("0 0 1 * 1")) == "at 00:00, on day 1 of the month or on Monday"


@pytest.mark.parametrize("same", ["0,15,30,45 * * * *", "0-59/15 * * * *", "*/15 * * * *"])
def test_equal_value_sets_read_alike(same: str) -> None:
    assert describe(parse_cron(same)) == "every 15 minutes"


def test_next_fires_in_the_zone_and_in_utc() -> None:
    # 02:00 Berlin: 01:00Z in winter; the spring-forward night (2026-03-29) has no 02:00, and
    # the schedule fires at 03:00 new time, 01:00Z (the DST rule of dispatcher.cron.expression)
    schedule = parse_cron("0 2 * * *", "Europe/Berlin")
    fires = _next_fires(schedule, datetime(2026, 3, 27, 12, 0, tzinfo=UTC))
    assert len(fires) == NEXT_FIRES_SHOWN
    assert fires[:3] == [
        {"at": "2026-03-28T01:00:00Z", "local": "2026-03-28T02:00:00+01:00"},
        {"at": "2026-03-29T01:00:00Z", "local": "2026-03-29T03:00:00+02:00"},
        {"at": "2026-03-30T00:00:00Z", "local": "2026-03-30T02:00:00+02:00"},
    ]
