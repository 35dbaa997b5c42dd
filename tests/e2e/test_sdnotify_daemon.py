"""systemd's view of a real daemon process: READY, then WATCHDOG pings, then STOPPING."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

from tests.harness.fixtures import Spawn


async def receive(sock: socket.socket, until: str, timeout_s: float = 20) -> list[str]:
    loop = asyncio.get_running_loop()
    messages: list[str] = []
    deadline = time.monotonic() + timeout_s
    while until not in messages:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {until} within {timeout_s} s; got {messages}"
        data = await asyncio.wait_for(loop.sock_recv(sock, 4096), remaining)
        messages += data.decode().splitlines()
    return messages


async def test_ready_watchdog_stopping_over_a_real_notify_socket(
    db_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.setblocking(False)
        daemon = await spawn(
            {
                "DISPATCHER_DATABASE_URL": db_url,
                "NOTIFY_SOCKET": str(path),
                "WATCHDOG_USEC": "1000000",
            },
            wait_ready=False,
        )
        first = await receive(sock, "READY=1")
        pings = await receive(sock, "WATCHDOG=1")
        pings += await receive(sock, "WATCHDOG=1")  # keeps pinging from the event loop
        assert await daemon.is_ready()
        daemon.signal(signal.SIGTERM)
        last = await receive(sock, "STOPPING=1")
        assert await daemon.wait() == 0
    assert "STOPPING=1" not in first and "READY=1" not in last
    assert pings.count("WATCHDOG=1") >= 2
