"""Waiting with a deadline, and a free loopback port.

`wait_until` polls; use it only for a state nothing signals (a count on a target's side, a
metric, a file). A daemon's log event (`DaemonHandle.log.wait_for`), a change of the jobs table
(`tests.harness.signals.job_changes`) and a loopback target's requests (`Target.wait_for`) are
signals: wait on those instead (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_candidates() -> list[int]:
    """This process's own slice of the ports below the kernel's ephemeral range.

    A port the kernel hands out for `bind(0)` lies in the ephemeral range, where every
    outgoing connection of every process takes its local port too: one of them took a port
    between the test's pick and the daemon's bind (a flaky "Address already in use"). Below
    that range nothing is handed out unasked, and each xdist worker picks from its own slice,
    so two workers never hand out the same port.
    """
    high = _ephemeral_low()
    low = max(1024, high - 20_000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    slices = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) if worker else 1
    index = int(worker.removeprefix("gw") or 0) if worker else 0
    size = max(1, (high - low) // slices)
    ports = list(range(low + index * size, low + (index + 1) * size))
    start = random.randrange(len(ports))  # another run beside this one starts elsewhere
    return ports[start:] + ports[:start]


_candidates: itertools.cycle[int] | None = None
_slice = 0  # how many ports the cycle holds: one turn of it tries each once


def free_port() -> int:
    """A loopback port free now, not handed out by this process lately (see `_port_candidates`)."""
    global _candidates, _slice
    if _candidates is None:
        ports = _port_candidates()
        _candidates, _slice = itertools.cycle(ports), len(ports)
    for port in itertools.islice(_candidates, _slice):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"none of this worker's {_slice} loopback ports is free")


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
