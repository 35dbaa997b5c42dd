"""The one way to run a daemon in a test, and the handle a test holds for it.

A daemon runs as `dispatcher run` in a child process (`DaemonProcess`: real signals, real exit
codes, its JSON log in a file), started by the `spawn`, `daemon` or `module_daemon` fixtures
(tests/conftest.py) or `daemon_process`; or in this process (`running_daemon`) where a test needs
the `Daemon` object itself or Python-only settings (a handler function, a tracing exporter), as
the service layer does. Both are a `DaemonHandle`: the same `base_url`, `request`, `post_job`,
`get_job` and `log` (events to wait for), so a test reads the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from dispatcher.config.settings import Settings, load_settings
from dispatcher.daemon import Daemon
from dispatcher.observability.tracing import Tracing
from tests.harness.logs import CapturedLog, FileLog, LogEvents
from tests.harness.waits import free_port, wait_until

ROOT = Path(__file__).parent.parent.parent
# What a daemon under test needs to deliver to the loopback targets the tests serve, and to find
# due work quickly: the environment form of make_settings' defaults.
LOOPBACK_ENV = {
    "DISPATCHER_TARGET_ALLOW_HTTP": "true",
    "DISPATCHER_TARGET_ALLOW_CIDRS": "127.0.0.0/8",
    "DISPATCHER_SCAN_INTERVAL_S": "0.2",
}
# the embedded PostgreSQL runs initdb on first start; allow for a slow machine
EMBEDDED_READY_S = 120.0
READY_S = 60.0


def make_settings(db_url: str, **overrides: Any) -> Settings:
    """Settings of an in-process daemon on `db_url`: a free port, loopback targets allowed."""
    raw: dict[str, Any] = {
        "database_url": db_url,
        "listen": f"127.0.0.1:{free_port()}",
        "target_allow_http": True,
        "target_allow_cidrs": ["127.0.0.0/8"],
        "scan_interval_s": 0.2,
        "drain_timeout_s": 5,
        "log_format": "text",
    }
    raw.update(overrides)
    return Settings.model_validate(raw)


class DaemonHandle:
    """A running daemon as a test sees it: its address, its HTTP API, its log."""

    base_url: str
    log: LogEvents

    async def request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
    ) -> tuple[int, Any]:
        """One HTTP request to the daemon: (status, the JSON body; None when empty)."""
        async with (
            aiohttp.ClientSession() as s,
            s.request(method, self.base_url + path, headers=headers, **kw) as r,
        ):
            return r.status, await r.json(content_type=None)

    async def post_job(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        status, job = await self.request(
            "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key}
        )
        assert status == 202, job
        return job  # type: ignore[no-any-return]

    async def get_job(self, job_id: int) -> dict[str, Any]:
        status, job = await self.request("GET", f"/v1/jobs/{job_id}")
        assert status == 200, job
        return job  # type: ignore[no-any-return]


class InProcessDaemon(DaemonHandle):
    """A `Daemon` running in the test's event loop (`running_daemon`)."""

    def __init__(self, daemon: Daemon, session: aiohttp.ClientSession, log: CapturedLog):
        self.daemon = daemon
        self.base_url = f"http://{daemon.settings.listen}"
        self.session = session
        self.log = log

    async def request(
        self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
    ) -> tuple[int, Any]:
        """As `DaemonHandle.request`, on `session` (headers a test set on it go along)."""
        async with self.session.request(method, self.base_url + path, headers=headers, **kw) as r:
            return r.status, await r.json(content_type=None)


@contextlib.asynccontextmanager
async def running_daemon(
    settings: Settings | dict[str, str], tracing: Tracing | None = None
) -> AsyncIterator[InProcessDaemon]:
    """The daemon in this process, from settings or from the environment a child would get;
    stopped (and required to exit 0) when the block ends."""
    if not isinstance(settings, Settings):
        settings = load_settings(
            None, {"DISPATCHER_LISTEN": f"127.0.0.1:{free_port()}", **settings}
        )
    daemon = Daemon(settings, tracing)
    with CapturedLog() as log:
        task = asyncio.create_task(daemon.run(handle_signals=False))
        ready = asyncio.create_task(daemon.ready.wait())
        await asyncio.wait([task, ready], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raise the start-up error
        assert daemon.ready.is_set(), "daemon did not become ready"
        async with aiohttp.ClientSession() as session:
            try:
                yield InProcessDaemon(daemon, session, log)
            finally:
                daemon.request_stop()
                assert await asyncio.wait_for(task, 30) == 0


class DaemonProcess(DaemonHandle):
    """`dispatcher run` as a real child process, configured through the environment."""

    def __init__(self, env: dict[str, str], port: int | None = None):
        self.port = port or free_port()
        self.env = {
            **os.environ,
            "DISPATCHER_LISTEN": f"127.0.0.1:{self.port}",
            "DISPATCHER_LOG_FORMAT": "json",
            **env,
        }
        self.env.setdefault("PYTHONPATH", str(ROOT))
        self.argv = [sys.executable, "-m", "dispatcher.cli", "run"]
        self.proc: asyncio.subprocess.Process | None = None
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log: FileLog = FileLog(Path(tempfile.mkstemp(prefix="dispatcher-log-")[1]))

    @property
    def log_path(self) -> Path:
        return self.log.path

    @log_path.setter
    def log_path(self, path: Path) -> None:
        self.log = FileLog(path)

    async def start(self, wait_ready: bool = True) -> DaemonProcess:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdout=asyncio.subprocess.DEVNULL, stderr=log
            )
        if wait_ready:
            await wait_until(self.is_ready, timeout_s=READY_S, interval_s=0.05, what="ready")
        return self

    async def is_ready(self) -> bool:
        assert self.proc is not None
        if self.proc.returncode is not None:
            err = self.log_text()[-3000:]
            raise AssertionError(f"daemon exited {self.proc.returncode}: {err}")
        try:
            async with aiohttp.ClientSession() as s, s.get(f"{self.base_url}/readyz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def wait(self, timeout_s: float = 30) -> int:
        assert self.proc is not None
        await asyncio.wait_for(self.proc.wait(), timeout_s)
        return self.proc.returncode  # type: ignore[return-value]

    def log_text(self) -> str:
        return self.log_path.read_text()

    async def stop(self) -> int:
        """SIGTERM and the exit status (or the status it already exited with)."""
        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else 0  # type: ignore[return-value]
        self.signal(signal.SIGTERM)
        return await self.wait()

    async def kill(self) -> None:
        """SIGKILL if it still runs: what every fixture does last, whatever the test did."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen one (SIGSTOP) too
            self.proc.kill()
            await self.proc.wait()


@contextlib.asynccontextmanager
async def daemon_process(
    env: dict[str, str], port: int | None = None, unset: tuple[str, ...] = ()
) -> AsyncIterator[DaemonProcess]:
    """Start `dispatcher run`; whatever happens in the block, the child does not outlive it."""
    daemon = DaemonProcess(env, port=port)
    for name in unset:
        daemon.env.pop(name, None)
    try:
        await daemon.start(wait_ready=False)
        await wait_until(daemon.is_ready, timeout_s=EMBEDDED_READY_S, what="daemon ready")
        yield daemon
    finally:
        await daemon.kill()


async def terminate(daemon: DaemonProcess) -> None:
    """SIGTERM, and a clean exit 0 within a minute."""
    daemon.signal(signal.SIGTERM)
    try:
        code = await daemon.wait(timeout_s=60)
    except TimeoutError:
        raise AssertionError("no exit 60 s after SIGTERM: " + daemon.log_text()[-3000:]) from None
    assert code == 0, daemon.log_text()[-3000:]
    assert "dispatcher stopped" in daemon.log_text()


async def post(daemon: DaemonHandle, key: str, body: dict[str, Any]) -> tuple[int, Any]:
    return await daemon.request("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})


async def get(daemon: DaemonHandle, path: str) -> tuple[int, Any]:
    return await daemon.request("GET", path)
