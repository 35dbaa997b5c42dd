"""A listen address that cannot be bound ends `dispatcher run` with one line naming the address
and the setting, before anything starts (no database wait, no embedded server, no traceback)."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest

from tests.harness import free_port

# Nothing listens there, and start-up would wait a minute for it: a quick exit proves the listen
# address is checked before the database.
UNREACHABLE_DATABASE = "postgresql://nobody@127.0.0.1:1/none"


async def run_until_exit(env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatcher.cli",
        "run",
        env={
            "DISPATCHER_DATABASE_URL": UNREACHABLE_DATABASE,
            "DISPATCHER_DATABASE_WAIT_S": "600",
            "DISPATCHER_LOG_FORMAT": "text",
            "PATH": "/usr/bin:/bin",
            **env,
        },
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


def assert_one_line(code: int, text: str, listen: str, setting: str) -> str:
    assert code == 1, text
    assert "Traceback" not in text and "database" not in text, text
    (line,) = text.strip().splitlines()
    assert line.startswith(f"dispatcher: cannot listen on {listen}"), text
    assert setting in line
    return line


async def test_a_port_in_use_is_one_line_before_anything_starts() -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        listen = f"127.0.0.1:{port}"
        code, text = await run_until_exit({"DISPATCHER_LISTEN": listen})
    line = assert_one_line(code, text, listen, "DISPATCHER_LISTEN")
    assert "another process" in line


async def test_the_metrics_listener_is_checked_the_same_way() -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        listen = f"127.0.0.1:{port}"
        env = {"DISPATCHER_LISTEN": f"127.0.0.1:{free_port()}", "DISPATCHER_METRICS_LISTEN": listen}
        code, text = await run_until_exit(env)
    assert_one_line(code, text, listen, "DISPATCHER_METRICS_LISTEN")


@pytest.mark.parametrize("listen", ["192.0.2.10:8080", "no-such-host.invalid:8080"])
async def test_an_address_not_of_this_host_is_one_line(listen: str) -> None:
    env = {
        "DISPATCHER_LISTEN": listen,
        "DISPATCHER_API_TOKENS": "t-0123456789abcdef0123456789abcdef",
        "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "true",
    }
    code, text = await run_until_exit(env)
    line = assert_one_line(code, text, listen, "DISPATCHER_LISTEN")
    assert "not one of this host's" in line
