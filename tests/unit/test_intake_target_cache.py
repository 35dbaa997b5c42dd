"""The intake's cache of validated targets is bounded by the characters it holds, not by a count
of entries that may each be as large as the body limit."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dispatcher.config.settings import Settings
from dispatcher.intake.accept import TARGET_CACHE_CHARS, TARGET_CACHE_ENTRY_MAX_CHARS, Intake
from dispatcher.intake.requests import JobRequest
from dispatcher.model import NewJob


class CountingValidator:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, target: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return dict(target)


def target(n: int, chars: int) -> dict[str, Any]:
    return {"url": f"https://hooks.example.com/{n}", "pad": "x" * chars}


def accept(intake: Intake, t: dict[str, Any]) -> None:
    checked = intake.check("k", JobRequest(handler="http", target=t), datetime.now(UTC))
    assert isinstance(checked, NewJob), checked


def cached_chars(intake: Intake) -> int:
    return sum(len(key) for key in intake._targets)


def test_the_cache_holds_at_most_its_budget_and_keeps_the_newest() -> None:
    validator = CountingValidator()
    intake = Intake(Settings(), None, validator)  # type: ignore[arg-type]
    size = TARGET_CACHE_ENTRY_MAX_CHARS - 100
    n = 3 * TARGET_CACHE_CHARS // size
    for i in range(n):
        accept(intake, target(i, size))
        assert cached_chars(intake) <= TARGET_CACHE_CHARS
    assert cached_chars(intake) > TARGET_CACHE_CHARS // 2
    calls = validator.calls
    accept(intake, target(n - 1, size))  # the newest is remembered
    assert validator.calls == calls
    accept(intake, target(0, size))  # the oldest was let go
    assert validator.calls == calls + 1


def test_a_target_over_the_entry_cap_is_validated_every_time_and_never_kept() -> None:
    validator = CountingValidator()
    intake = Intake(Settings(), None, validator)  # type: ignore[arg-type]
    big = target(1, TARGET_CACHE_ENTRY_MAX_CHARS)
    for _ in range(3):
        accept(intake, big)
    assert validator.calls == 3
    assert cached_chars(intake) == 0
    small = target(2, 10)
    for _ in range(3):
        accept(intake, small)
    assert validator.calls == 4
