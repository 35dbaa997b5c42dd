"""Run windows as a pure function of the instant: parsing, crossing midnight, overlaps, and
both daylight-saving transitions (Europe/Berlin: 2026-03-29 02:00->03:00, 2026-10-25
03:00->02:00)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatcher.cron.windows import WindowError, parse_window, parse_windows, window_state

SEED_001 = ["Mon-Fri 18:00-07:00 Europe/Berlin", "Sat-Sun 00:00-24:00 Europe/Berlin"]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_evening_window_crosses_midnight() -> None:
    windows = parse_windows(["Mon-Fri 18:00-07:00 Europe/Berlin"])
    # Tuesday 2026-06-09, Berlin is UTC+2
    closed = window_state(windows, utc("2026-06-09T12:00:00+02:00"))
    assert not closed.open
    assert closed.opens_at == utc("2026-06-09T18:00:00+02:00")
    opened = window_state(windows, utc("2026-06-09T23:30:00+02:00"))
    assert opened.open and opened.closes_at == utc("2026-06-10T07:00:00+02:00")
    # Saturday 06:59 is still Friday's window; Saturday 18:00 opens nothing (weekdays only)
    assert window_state(windows, utc("2026-06-13T06:59:00+02:00")).open
    late_saturday = window_state(windows, utc("2026-06-13T19:00:00+02:00"))
    assert not late_saturday.open
    assert late_saturday.opens_at == utc("2026-06-15T18:00:00+02:00")  # Monday evening


def test_edges_are_half_open() -> None:
    windows = parse_windows(["daily 09:00-10:00 UTC"])
    assert window_state(windows, utc("2026-06-09T09:00:00+00:00")).open
    assert not window_state(windows, utc("2026-06-09T10:00:00+00:00")).open
    assert not window_state(windows, utc("2026-06-09T08:59:59+00:00")).open


def test_seed_001_windows_merge_over_the_weekend() -> None:
    windows = parse_windows(SEED_001)
    friday_night = window_state(windows, utc("2026-06-12T20:00:00+02:00"))
    # Friday's evening window runs into the weekend window: one stretch until Sunday 24:00
    # (Monday 00:00-07:00 belongs to no window: Sunday is not in Mon-Fri)
    assert friday_night.open and friday_night.closes_at == utc("2026-06-15T00:00:00+02:00")
    monday_noon = window_state(windows, utc("2026-06-15T12:00:00+02:00"))
    assert not monday_noon.open and monday_noon.opens_at == utc("2026-06-15T18:00:00+02:00")


def test_no_windows_is_always_open() -> None:
    state = window_state((), utc("2026-06-09T12:00:00+00:00"))
    assert state.open and state.opens_at is None and state.closes_at is None


def test_spring_forward_gap_edge_opens_when_the_clock_would_have_shown_it() -> None:
    # 2026-03-29: Berlin jumps from 02:00 CET to 03:00 CEST; 02:30 does not exist
    windows = parse_windows(["Sun 02:30-05:00 Europe/Berlin"])
    before = window_state(windows, utc("2026-03-29T00:59:00+00:00"))  # 01:59 CET
    assert not before.open
    assert before.opens_at == utc("2026-03-29T01:30:00+00:00")  # 03:30 CEST, the cron rule
    during = window_state(windows, utc("2026-03-29T02:00:00+00:00"))  # 04:00 CEST
    assert during.open and during.closes_at == utc("2026-03-29T03:00:00+00:00")  # 05:00 CEST


def test_spring_forward_night_window_is_an_hour_shorter() -> None:
    windows = parse_windows(["Sat 22:00-06:00 Europe/Berlin"])
    state = window_state(windows, utc("2026-03-28T23:00:00+00:00"))  # Sunday 00:00 CET
    assert state.open
    assert state.closes_at == utc("2026-03-29T04:00:00+00:00")  # 06:00 CEST
    opened = utc("2026-03-28T21:00:00+00:00")  # 22:00 CET
    assert (state.closes_at - opened).total_seconds() == 7 * 3600


def test_fall_back_edge_in_the_repeated_hour_takes_its_first_occurrence() -> None:
    # 2026-10-25: Berlin goes from 03:00 CEST back to 02:00 CET; 02:30 happens twice
    windows = parse_windows(["Sun 00:00-02:30 Europe/Berlin"])
    state = window_state(windows, utc("2026-10-24T23:00:00+00:00"))  # 01:00 CEST
    assert state.open and state.closes_at == utc("2026-10-25T00:30:00+00:00")  # first 02:30
    # the second 02:30 (01:30 UTC) is outside: the window closed at the first
    assert not window_state(windows, utc("2026-10-25T01:30:00+00:00")).open


def test_fall_back_night_window_is_an_hour_longer() -> None:
    windows = parse_windows(["Sat 22:00-06:00 Europe/Berlin"])
    state = window_state(windows, utc("2026-10-25T02:30:00+00:00"))  # 03:30 CET
    assert state.open and state.closes_at == utc("2026-10-25T05:00:00+00:00")  # 06:00 CET
    assert (state.closes_at - utc("2026-10-24T20:00:00+00:00")).total_seconds() == 9 * 3600


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("Mon-Fri 18:00-07:00 Europe/Berlln", "Europe/Berlln"),
        ("Mon-Fry 18:00-07:00 UTC", "day 'Fry'"),
        ("Mon-Fri 18:00 UTC", "hours '18:00'"),
        ("Mon-Fri 25:00-07:00 UTC", "start '25:00'"),
        ("Mon-Fri 18:00-7h UTC", "end '7h'"),
        ("Mon-Fri 18:60-07:00 UTC", "start '18:60'"),
        ("Mon-Fri 24:00-07:00 UTC", "start 24:00"),
        ("Mon-Fri 08:00-08:00 UTC", "00:00-24:00"),
        ("Mon-Fri", "found 1 part"),
        ("Mon-Fri 18:00-07:00 Europe/Berlin extra", "found 4 part"),
    ],
)
def test_bad_window_names_the_wrong_part(text: str, names: str) -> None:
    with pytest.raises(WindowError) as caught:
        parse_window(text)
    assert names in str(caught.value)
    assert repr(text) in str(caught.value)


def test_windows_must_be_a_list() -> None:
    with pytest.raises(WindowError, match="list"):
        parse_windows("Mon-Fri 18:00-07:00 UTC")  # type: ignore[arg-type]


def test_seconds_are_allowed() -> None:
    windows = parse_windows(["daily 09:00:30-09:00:45 UTC"])
    assert not window_state(windows, utc("2026-06-09T09:00:29+00:00")).open
    state = window_state(windows, utc("2026-06-09T09:00:30+00:00"))
    assert state.open and state.closes_at == utc("2026-06-09T09:00:45+00:00")
    with pytest.raises(WindowError, match="'09:00:60'"):
        parse_window("daily 09:00:60-10:00 UTC")


def test_day_lists_and_wrapping_ranges() -> None:
    assert parse_window("Fri-Mon 00:00-24:00").days == {5, 6, 7, 1}
    assert parse_window("Sat,Sun,Wednesday 01:00-02:00").days == {6, 7, 3}
    assert parse_window("daily 01:00-02:00").days == set(range(1, 8))
