"""The `dispatcher` command as users run it, and daemons on the embedded database of a state
directory (its servers, its commands)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from tests.harness.daemons import DaemonProcess, daemon_process
from tests.harness.waits import wait_until

CLI_TIMEOUT_S = 60.0


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def command() -> list[str]:
    """The installed console script, as users run it (or the module when not installed)."""
    script = shutil.which("dispatcher", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "dispatcher.cli"]


async def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Result:
    """`dispatcher ARGS` in `cwd`, configured by `env` alone (no DISPATCHER_* of the shell)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    return await run_program([*command(), *args], cwd=cwd, env={**base, **(env or {})})


async def run_program(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout_s: float = CLI_TIMEOUT_S
) -> Result:
    """`argv` run to its end; killed, and TimeoutError raised, past `timeout_s`."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


# the embedded database ------------------------------------------------------------------------
def postmasters(data_dir: Path) -> list[int]:
    """Every live process whose command line names `data_dir`: the servers of that directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"postgres") and str(data_dir).encode() in args:
            found.append(int(entry.name))
    return found


def env_for(state: Path, **extra: str) -> dict[str, str]:
    return {"DISPATCHER_STATE_DIR": str(state), **extra}


@contextlib.asynccontextmanager
async def daemon_on(state: Path, **extra: str) -> AsyncIterator[DaemonProcess]:
    """`dispatcher run` on the embedded database of `state`; killed if the block leaves it."""
    async with daemon_process(
        env_for(state, **extra), unset=("DISPATCHER_DATABASE_URL",)
    ) as daemon:
        yield daemon


async def no_server_left(data_dir: Path) -> None:
    async def gone() -> bool:
        return not postmasters(data_dir)

    await wait_until(gone, timeout_s=30, what=f"no PostgreSQL left for {data_dir}")
    assert not (data_dir / "postmaster.pid").exists()


async def run_cli(state: Path, *args: str, **extra: str) -> Result:
    """A command beside the embedded database of `state`."""
    return await cli(*args, cwd=state.parent, env=env_for(state, **extra))
