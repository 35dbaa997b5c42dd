"""sd_notify against a real unix datagram socket, the way systemd listens for it."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.runtime import sdnotify
from dispatcher.runtime.sdnotify import Watchdog, notify, watchdog_interval_s

DEADLINE_S = 5.0


@pytest.fixture
def listener(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket bound in a fresh directory and named by NOTIFY_SOCKET."""
    with tempfile.TemporaryDirectory(prefix="sdnotify-") as directory:
        path = Path(directory) / "notify"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(path))
        sock.settimeout(DEADLINE_S)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        try:
            yield sock
        finally:
            sock.close()


def test_ready_and_stopping_arrive_as_datagrams(listener: socket.socket) -> None:
    assert notify(sdnotify.READY)
    assert listener.recv(4096) == b"READY=1"
    assert notify(sdnotify.STOPPING)
    assert listener.recv(4096) == b"STOPPING=1"


def test_multi_line_message_is_one_datagram(listener: socket.socket) -> None:
    assert notify("READY=1\nSTATUS=serving")
    assert listener.recv(4096) == b"READY=1\nSTATUS=serving"


def test_abstract_namespace_socket() -> None:
    name = f"dispatcher-test-{os.getpid()}-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(DEADLINE_S)
        assert notify(sdnotify.WATCHDOG, {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_unset_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify(sdnotify.READY) is False
    assert notify(sdnotify.READY, {"NOTIFY_SOCKET": ""}) is False


def test_unusable_socket_returns_false_without_raising() -> None:
    with tempfile.TemporaryDirectory(prefix="sdnotify-") as directory:
        missing = str(Path(directory) / "nobody-listens")
        assert notify(sdnotify.READY, {"NOTIFY_SOCKET": missing}) is False
    assert notify(sdnotify.READY, {"NOTIFY_SOCKET": "vsock:2:1234"}) is False


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
    ],
)
def test_watchdog_interval_is_half_the_period_for_this_process(
    environ: dict[str, str], expected: float | None
) -> None:
    assert watchdog_interval_s(environ) == expected


async def test_watchdog_pings_from_the_loop_until_stopped(listener: socket.socket) -> None:
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    watchdog = Watchdog(interval_s=0.02)
    await watchdog.start()
    assert watchdog.running
    for _ in range(3):  # the first ping from start(), then at least two from the ticker
        datagram = await asyncio.wait_for(loop.sock_recv(listener, 4096), DEADLINE_S)
        assert datagram == b"WATCHDOG=1"
    await watchdog.stop()
    assert not watchdog.running
    await watchdog.stop()  # idempotent


class Recorder:
    """A `send` that keeps the messages and wakes whoever waits for a count of them."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._changed = asyncio.Event()

    def __call__(self, message: str) -> bool:
        self.sent.append(message)
        self._changed.set()
        return True

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(DEADLINE_S):
            while len(self.sent) < count:
                self._changed.clear()
                await self._changed.wait()


async def test_watchdog_stops_pinging_while_the_loop_is_blocked() -> None:
    record = Recorder()
    watchdog = Watchdog(interval_s=0.01, send=record)
    await watchdog.start()
    await record.wait_for(3)  # the ticker runs while the loop turns
    count = len(record.sent)
    time.sleep(0.1)  # noqa: ASYNC251 - a stuck loop on purpose: ten intervals pass unpinged
    assert len(record.sent) == count
    await watchdog.stop()


async def test_watchdog_is_inert_without_a_watchdog_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    record = Recorder()
    watchdog = Watchdog(send=record)
    await watchdog.start()
    assert not watchdog.running
    assert record.sent == []
    await watchdog.stop()
