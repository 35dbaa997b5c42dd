"""Fixtures of the fault-injection suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.harness import DaemonProcess

Spawn = Callable[..., Awaitable[DaemonProcess]]


@pytest.fixture
async def spawn() -> AsyncIterator[Spawn]:
    """Start `dispatcher run` children; whatever the test does, none outlives it."""
    started: list[DaemonProcess] = []

    async def start(env: dict[str, str], *, wait_ready: bool = True) -> DaemonProcess:
        daemon = DaemonProcess(env)
        started.append(daemon)
        return await daemon.start(wait_ready=wait_ready)

    yield start
    for daemon in started:
        if daemon.proc is not None and daemon.proc.returncode is None:
            daemon.proc.kill()
            await daemon.proc.wait()
