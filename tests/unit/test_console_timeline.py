"""A job's timeline on its console page: events in time order, each time to the second, and to
the millisecond where two or more events share a second (five events at 06:48:15 are otherwise
one moment)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dispatcher.console.pages import timeline, when, when_ms

T = datetime(2026, 5, 31, 6, 48, 15, 120_000, tzinfo=UTC)


def job(**fields: Any) -> dict[str, Any]:
    return {"created_at": T, "due_at": T, "finished_at": None, "state": "ready",
            "dead_reason": None, **fields}  # fmt: skip


def attempt(n: int, start: datetime, end: datetime, outcome: str) -> dict[str, Any]:
    return {"attempt": n, "started_at": start, "finished_at": end, "owner": "host:1",
            "outcome": outcome, "reason": None, "http_status": None}  # fmt: skip


def test_times_are_to_the_second_or_to_the_millisecond() -> None:
    assert when(T) == "2026-05-31 06:48:15Z"
    assert when_ms(T) == "2026-05-31 06:48:15.120Z"
    assert when_ms("2026-05-31T06:48:15.000999+00:00") == "2026-05-31 06:48:15.000Z"
    assert when(None) == when_ms(None) == "—"


def test_only_events_that_share_a_second_are_precise() -> None:
    ms = timedelta(milliseconds=1)
    a1 = attempt(1, T + 300 * ms, T + 700 * ms, "failed")
    a2 = attempt(2, T + timedelta(seconds=5), T + timedelta(seconds=6, milliseconds=500), "ok")
    events = timeline(job(finished_at=T + timedelta(seconds=9), state="succeeded"), [a1, a2])
    assert [e["what"] for e in events] == [
        "accepted",
        "due",
        "attempt 1 started",
        "attempt 1 failed",
        "attempt 2 started",
        "attempt 2 ok",
        "succeeded",
    ]
    assert [e["precise"] for e in events] == [True] * 4 + [False] * 3
