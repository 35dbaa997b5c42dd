"""Cron arithmetic: standard expressions only, DST in real zones, run keys, fan-out units."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from dispatcher.config.settings import load_settings
from dispatcher.core.rfc3339 import format as rfc3339
from dispatcher.cron.expression import (
    CronExpressionError,
    PeriodError,
    parse_cron,
    query_units,
    range_units,
    run_key,
    tenant_units,
)
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.errors import ConfigError

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
ROOT = Path(__file__).resolve().parents[2]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def day_periods(expression: str, zone: ZoneInfo, y: int, m: int, d: int) -> list[datetime]:
    """Period starts whose local date is y-m-d."""
    schedule = parse_cron(expression, zone.key)
    start = datetime(y, m, d, tzinfo=zone).astimezone(UTC) - timedelta(hours=3)
    end = start + timedelta(hours=30)
    return [p for p in schedule.periods(start, end) if p.astimezone(zone).date().day == d]


# parsing ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "field", "expected"),
    [
        ("*/15 * * * *", "minutes", (0, 15, 30, 45)),
        ("0 9-17/4 * * *", "hours", (9, 13, 17)),
        ("5,10,55 * * * *", "minutes", (5, 10, 55)),
        ("0 0 * jan,JUL *", "months", frozenset({1, 7})),
        ("0 0 * * mon-fri", "weekdays", frozenset({1, 2, 3, 4, 5})),
        ("0 0 * * 0", "weekdays", frozenset({0})),
        ("0 0 * * 7", "weekdays", frozenset({0})),  # 7 is Sunday too
        ("0 0 * * 5-7", "weekdays", frozenset({5, 6, 0})),
    ],
)
def test_standard_fields(expression: str, field: str, expected: object) -> None:
    assert getattr(parse_cron(expression), field) == expected


def test_weekday_zero_is_sunday_unlike_apscheduler_3() -> None:
    sundays = list(parse_cron("0 12 * * 0").periods(utc(2026, 6, 1), utc(2026, 6, 30)))
    assert [p.strftime("%a") for p in sundays] == ["Sun"] * 4


def test_day_of_month_and_weekday_or_together_when_both_restricted() -> None:
    fires = list(parse_cron("0 0 13 * 5").periods(utc(2026, 2, 1), utc(2026, 2, 28, 23)))
    # every Friday in February 2026 plus the 13th (itself a Friday)
    assert [p.day for p in fires] == [6, 13, 20, 27]
    fires = list(parse_cron("0 0 1 * 1").periods(utc(2026, 6, 1), utc(2026, 6, 30, 23)))
    assert [p.day for p in fires] == [1, 8, 15, 22, 29]  # Jun 1 2026 is a Monday


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("0 0 L * *", "'L' (last day"),
        ("0 0 * * 5L", "'L' (last day"),
        ("0 0 15W * *", "'W' (nearest weekday)"),
        ("0 0 LW * *", "Quartz"),
        ("0 0 * * 5#3", "'#' (nth weekday"),
        ("0 0 ? * *", "'?' is a Quartz extension"),
        ("H * * * *", "'H' (hashed value)"),
        ("@reboot", "'@' shortcuts"),
        ("@daily", "'0 0 * * *'"),
        ("0 0 0 * * *", "has 6 fields"),
        ("0 0 * * * 2026", "has 6 fields"),
        ("0 0 * *", "has 4 fields"),
        ("60 * * * *", "minute 60 is out of range 0-59"),
        ("0 24 * * *", "hour 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month 0 is out of range 1-31"),
        ("0 0 * 13 *", "month 13 is out of range 1-12"),
        ("0 0 * * 8", "day-of-week 8 is out of range 0-7"),
        ("0 22-2 * * *", "wrap-around ranges are not standard"),
        ("5/10 * * * *", "a step needs '*' or a range"),
        ("*/0 * * * *", "step '0' must be 1 or more"),
        ("1,,2 * * * *", "empty list item"),
        ("0 0 * * funday", "'funday' is not a name"),
        ("0 0 31 2 *", "never fires"),
        ("0 0 30 feb *", "never fires"),
        ("0 0 * * mon%2", "characters outside"),
    ],
)
def test_non_standard_expressions_are_refused(expression: str, fragment: str) -> None:
    with pytest.raises(CronExpressionError) as info:
        parse_cron(expression)
    assert fragment in str(info.value)
    assert repr(expression) in str(info.value)


def test_feb_29_is_allowed_and_fires_in_leap_years() -> None:
    fires = list(parse_cron("0 0 29 2 *").periods(utc(2026, 1, 1), utc(2029, 1, 1)))
    assert fires == [utc(2028, 2, 29)]
    assert parse_cron("0 0 29 2 *").next_after(utc(2026, 1, 1)) == utc(2028, 2, 29)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "/etc/localtime", "../UTC"])
def test_unknown_time_zones_are_refused(zone: str) -> None:
    with pytest.raises(CronExpressionError, match="IANA"):
        parse_cron("0 0 * * *", zone)


# daylight saving time -----------------------------------------------------------------------
def test_berlin_spring_forward_0230_fires_once() -> None:
    # 2026-03-29: 02:00 CET -> 03:00 CEST, so 02:30 does not exist that day
    fires = day_periods("30 2 * * *", BERLIN, 2026, 3, 29)
    assert fires == [utc(2026, 3, 29, 1, 30)]  # 03:30 CEST, where 02:30 would have been
    assert run_key("cleanup", fires[0]) == "cleanup:2026-03-29T01:30:00Z"
    neighbours = list(
        parse_cron("30 2 * * *", "Europe/Berlin").periods(utc(2026, 3, 27), utc(2026, 3, 31))
    )
    assert neighbours == [
        utc(2026, 3, 27, 1, 30),
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 30),
        utc(2026, 3, 30, 0, 30),
    ]


def test_berlin_fall_back_0230_fires_once() -> None:
    # 2026-10-25: 03:00 CEST -> 02:00 CET, so 02:30 happens twice; fire at the first
    fires = day_periods("30 2 * * *", BERLIN, 2026, 10, 25)
    assert fires == [utc(2026, 10, 25, 0, 30)]
    assert run_key("cleanup", fires[0]) == "cleanup:2026-10-25T00:30:00Z"


def test_new_york_spring_forward_and_fall_back_fire_once() -> None:
    assert day_periods("30 2 * * *", NEW_YORK, 2026, 3, 8) == [utc(2026, 3, 8, 7, 30)]
    assert day_periods("30 1 * * *", NEW_YORK, 2026, 11, 1) == [utc(2026, 11, 1, 5, 30)]
    assert day_periods("30 2 * * *", NEW_YORK, 2026, 11, 1) == [utc(2026, 11, 1, 7, 30)]


def test_interval_schedules_follow_elapsed_time_across_dst() -> None:
    spring = day_periods("30 * * * *", BERLIN, 2026, 3, 29)
    fall = day_periods("30 * * * *", BERLIN, 2026, 10, 25)
    assert len(spring) == 23 and len(fall) == 25
    for fires in (spring, fall):
        gaps = {b - a for a, b in pairwise(fires)}
        assert gaps == {timedelta(hours=1)}  # no duplicate and no hole in elapsed time
    quarter = day_periods("*/15 * * * *", BERLIN, 2026, 3, 29)
    assert len(quarter) == 23 * 4 and len(set(quarter)) == len(quarter)


def test_next_after_and_latest_agree_with_periods_across_dst() -> None:
    for expression in ("30 2 * * *", "30 * * * *", "0 */5 * * *", "15 1-3 * * sun"):
        schedule = parse_cron(expression, "Europe/Berlin")
        expected = list(schedule.periods(utc(2026, 3, 20), utc(2026, 11, 5)))
        walked, t = [], utc(2026, 3, 20) - timedelta(microseconds=1)
        while (t := schedule.next_after(t)) is not None and t <= utc(2026, 11, 5):  # type: ignore[assignment]
            walked.append(t)
        assert walked == expected, expression
        for p in expected[:50]:
            assert schedule.latest_at_or_before(p) == p
            assert schedule.latest_at_or_before(p + timedelta(seconds=59)) == p
            assert schedule.is_period_start(p)
            assert not schedule.is_period_start(p + timedelta(minutes=1)) or "*" in expression


# run keys and units -------------------------------------------------------------------------
def test_run_keys_are_utc_rfc3339_of_the_scheduled_start() -> None:
    local = datetime(2026, 5, 31, 2, 0, tzinfo=BERLIN)
    assert run_key("nightly", local) == "nightly:2026-05-31T00:00:00Z"
    assert rfc3339(local) == "2026-05-31T00:00:00Z"
    with pytest.raises(PeriodError, match="no UTC offset"):
        run_key("nightly", datetime(2026, 5, 31))


def test_ranges_cover_the_key_space_without_gaps() -> None:
    units = range_units(16, 0, 65536)
    assert [u.name for u in units][:3] == ["r00-of-16", "r01-of-16", "r02-of-16"]
    assert units[-1].name == "r15-of-16"
    assert units[0].fields["range_start"] == 0 and units[-1].fields["range_end"] == 65536
    for a, b in pairwise(units):
        assert a.fields["range_end"] == b.fields["range_start"]
    uneven = range_units(240, 0, 1000)
    assert len({u.name for u in uneven}) == 240 and uneven[0].name == "r000-of-240"
    assert sum(u.fields["range_end"] - u.fields["range_start"] for u in uneven) == 1000
    with pytest.raises(PeriodError):
        range_units(16, 0, 10)


def test_tenant_and_query_units() -> None:
    assert [(u.name, u.tenant) for u in tenant_units(["p-1", "p-2"])] == [
        ("p-1", "p-1"),
        ("p-2", "p-2"),
    ]
    assert [u.name for u in query_units(["a", 7, "c"], limit=10)] == ["a", "7", "c"]
    with pytest.raises(PeriodError, match="twice"):
        query_units(["a", "a"], limit=10)
    with pytest.raises(PeriodError, match="printable ASCII"):
        query_units(["ok", None], limit=10)
    with pytest.raises(PeriodError, match="printable ASCII"):  # `$` would let this through
        query_units(["ok", "unit\n"], limit=10)
    with pytest.raises(PeriodError, match="limit is 2"):
        query_units(["a", "b", "c"], limit=2)


def test_jobs_for_a_period_are_deterministic() -> None:
    s = ScheduleSettings(
        name="cleanup",
        cron="0 2 * * *",
        timezone="Europe/Berlin",
        handler="expire",
        params={"page": 5},
        fanout={"ranges": 4, "key_space": [0, 100]},
        queue="maintenance",
    )
    period = utc(2026, 5, 31, 0, 0)
    jobs = s.jobs_for(period, s.static_units() or [])
    assert jobs == s.jobs_for(period, s.static_units() or [])
    assert [j.key for j in jobs] == [f"cleanup:2026-05-31T00:00:00Z:r0{i}-of-4" for i in range(4)]
    assert {j.run_key for j in jobs} == {"cleanup:2026-05-31T00:00:00Z"}
    assert jobs[1].payload == {
        "page": 5,
        "schedule": "cleanup",
        "period_start": "2026-05-31T00:00:00Z",
        "unit": "r01-of-4",
        "range_start": 25,
        "range_end": 50,
        "range_index": 1,
        "range_count": 4,
    }
    assert jobs[0].queue == "maintenance" and jobs[0].due_at is None


# configuration ------------------------------------------------------------------------------
def _schedule(**overrides: object) -> dict[str, object]:
    return {"name": "s", "cron": "0 * * * *", "handler": "h", **overrides}


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"cron": "0 0 L * *"}, "'L' (last day"),
        ({"cron": "@reboot"}, "'@' shortcuts"),
        ({"timezone": "Europe/Atlantis"}, "not a known IANA name"),
        ({"fanout": {"shards": 3}}, "fanout must be one of"),
        ({"fanout": {"ranges": 16, "key_space": [0, 8]}}, "too small for 16 ranges"),
        ({"fanout": {"tenants": ["a", "a"]}}, "unique"),
        ({"params": {"unit": 1}}, "params may not set ['unit']"),
        ({"handler": "http"}, 'handler "http" needs target'),
        ({"name": "Bad:Name"}, "String should match pattern"),
        ({"overlap": "sometimes"}, "'allow', 'skip' or 'queue'"),
        ({"cronn": "0 * * * *"}, "Extra inputs are not permitted"),
    ],
)
def test_schedule_settings_refuse_with_clear_errors(
    overrides: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ValidationError) as info:
        ScheduleSettings.model_validate(_schedule(**overrides))
    assert fragment in str(info.value)


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dispatcher.toml"
    path.write_text(text)
    return path


def test_non_standard_cron_in_config_stops_start_up(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        """
[handlers.noop]
kind = "python"
function = "mod:fn"

[[schedules]]
name = "monthly"
cron = "0 3 L * *"
handler = "noop"
""",
    )
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    message = str(info.value)
    assert "schedules.0.cron" in message and "'L' (last day" in message


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ('queue = "nowhere"', "queue 'nowhere' is not in [queues]"),
        ('handler = "ghost"', "handler 'ghost' is neither"),
    ],
)
def test_schedule_must_name_known_queue_and_handler(
    tmp_path: Path, extra: str, fragment: str
) -> None:
    handler = "" if "handler" in extra else 'handler = "noop"'
    path = _toml(
        tmp_path,
        f"""
[handlers.noop]
kind = "python"
function = "mod:fn"

[[schedules]]
name = "s"
cron = "0 3 * * *"
{handler}
{extra}
""",
    )
    with pytest.raises(ConfigError, match="schedule 's'") as info:
        load_settings(path, environ={})
    assert fragment in str(info.value)


def test_duplicate_schedule_names_are_refused(tmp_path: Path) -> None:
    entry = (
        '[[schedules]]\nname = "s"\ncron = "0 3 * * *"\nhandler = "http"\n'
        'target = { url = "https://example.com/hook" }\n'
    )
    with pytest.raises(ConfigError, match="defined twice"):
        load_settings(_toml(tmp_path, entry + entry), environ={})


def test_session_cleanup_example_config_loads() -> None:
    settings = load_settings(ROOT / "config" / "examples" / "session-cleanup.toml", environ={})
    (schedule,) = settings.schedules
    assert schedule.name == "session-cleanup" and schedule.overlap == "skip"
    assert [u.name for u in schedule.static_units() or []][:2] == ["r00-of-16", "r01-of-16"]
    handler = settings.handlers[schedule.handler]
    assert handler.kind == "sql"
    payload = schedule.jobs_for(utc(2026, 5, 31, 1, 15), schedule.static_units() or [])[0].payload
    assert all(p == "page_size" or p in payload for p in handler.params)
