"""Waiting with a deadline, and a free loopback port.

`wait_until` polls; use it only for a state nothing signals (a count on a target's side, a
metric, a file). A daemon's log event (`DaemonHandle.log.wait_for`), a change of the jobs table
(`tests.harness.signals.job_changes`) and a loopback target's requests (`Target.wait_for`) are
signals: wait on those instead (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool],
    timeout_s: float = 20.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = predicate()
        if asyncio.iscoroutine(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)


async def wait_signalled(
    changed: asyncio.Event,
    predicate: Callable[[], Awaitable[bool] | bool],
    timeout_s: float,
    what: str,
) -> None:
    """Check `predicate` now and again each time `changed` is set, until it holds or the
    deadline passes: a wait that wakes on a signal instead of a timer. Whoever changes the
    state sets `changed`; this clears it before each check, so no change is missed."""
    deadline = time.monotonic() + timeout_s
    while True:
        changed.clear()
        outcome = predicate()
        if asyncio.iscoroutine(outcome):
            outcome = await outcome
        if outcome:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        with contextlib.suppress(TimeoutError):  # one last check, then the deadline speaks
            await asyncio.wait_for(changed.wait(), left)
