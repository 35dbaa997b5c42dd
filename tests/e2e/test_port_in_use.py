"""A port already in use ends `dispatcher run` with one line naming the setting, not a traceback,
and whatever had started (database pools, the embedded server) is stopped again."""

from __future__ import annotations

import asyncio
import socket
import sys

from tests.harness import free_port


async def test_a_port_in_use_is_one_clear_line_and_exit_1(db_url: str) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dispatcher.cli",
            "run",
            env={
                "DISPATCHER_DATABASE_URL": db_url,
                "DISPATCHER_LISTEN": f"127.0.0.1:{port}",
                "DISPATCHER_LOG_FORMAT": "text",
                "PATH": "/usr/bin:/bin",
            },
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert proc.returncode == 1, text
    assert "Traceback" not in text, text
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"dispatcher: cannot listen on 127.0.0.1:{port}"), text
    assert "DISPATCHER_LISTEN" in last
