"""Whom a wake-up concerns (engine/work_poll.py `Wakeups`): a notice that names its queue
('ready:<queue>', dispatcher.wake_queue) wakes that queue's claim loop alone and at once, with
no work poll first however many queues the daemon runs; the older notices keep their meaning."""

from __future__ import annotations

from typing import Any, cast

from dispatcher.engine.work_poll import WAKE_EVERY_QUEUE_UP_TO, Wakeups


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def of(self, name: str) -> Any:
        return lambda *args: self.calls.append(" ".join([name, *map(str, args)]))


def bound(queues: int) -> tuple[Wakeups, Recorder]:
    seen = Recorder()
    workers = type(
        "Workers",
        (),
        {
            "workers": {f"q{n}": None for n in range(queues)},
            "wake": staticmethod(seen.of("every-loop")),
            "wake_queue": staticmethod(seen.of("loop")),
        },
    )()
    scanner = type("Scanner", (), {"wake": staticmethod(seen.of("scan"))})()
    poller = type("Poller", (), {"wake": staticmethod(seen.of("poll"))})()
    wake = Wakeups()
    wake.bind(cast(Any, workers), cast(Any, scanner), cast(Any, poller), relay=seen.of("relay"))
    return wake, seen


def test_a_notice_naming_its_queue_wakes_that_loop_alone_with_many_queues() -> None:
    wake, seen = bound(WAKE_EVERY_QUEUE_UP_TO + 48)
    wake("ready:q7")
    assert seen.calls == ["relay", "loop q7"]  # no poll, no due-scan


def test_a_queue_name_may_hold_the_separator() -> None:
    wake, seen = bound(1)
    wake("ready:a:b")
    assert seen.calls == ["relay", "loop a:b"]


def test_older_notices_keep_their_meaning() -> None:
    many, seen = bound(WAKE_EVERY_QUEUE_UP_TO + 1)
    many("ready")
    assert seen.calls == ["relay", "poll"]
    few, seen = bound(WAKE_EVERY_QUEUE_UP_TO)
    few("ready")
    few("scheduled")
    few("")
    assert seen.calls == ["relay", "every-loop", "scan", "relay", "every-loop", "scan"]
