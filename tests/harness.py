"""Test helpers, the one place for them: an in-process daemon on a test database, a recording
loopback target, waits, `dispatcher run` as a child process (its environment, SIGTERM, HTTP
calls), the `dispatcher` command, and the embedded database's servers. Shared fixtures (`api`,
the databases) are in conftest.py.

Everything is real: the daemon's own components on real PostgreSQL, real HTTP on 127.0.0.1.
Waits poll a condition until a deadline; none sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from dispatcher.config.settings import Settings
from dispatcher.daemon import Daemon
from dispatcher.observability.tracing import Tracing


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


async def enqueue_noop_jobs(
    pool: asyncpg.Pool, prefix: str, count: int, due: str | None = None
) -> None:
    """Enqueue `count` 'noop' jobs keyed `<prefix>-<n>` in one enqueue_many, due at SQL `due`."""
    due_times = "" if due is None else f", array_fill({due}, ARRAY[{count}])"
    await pool.execute(f"""
        SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg('{prefix}-' || g) FROM generate_series(1, {count}) g),
               array_fill('noop'::text, ARRAY[{count}]),
               array_fill('{{}}'::jsonb, ARRAY[{count}]){due_times})""")


async def stored_job(pool: Any, job_id: int | None = None, *, key: str | None = None) -> Any:
    """The whole stored job (payload and target included, which the repository's status reads
    leave out), by id or by key; None when there is none."""
    if key is not None:
        return await pool.fetchrow("SELECT * FROM dispatcher.jobs WHERE key = $1", key)
    return await pool.fetchrow("SELECT * FROM dispatcher.jobs WHERE id = $1", job_id)


def make_settings(db_url: str, **overrides: Any) -> Settings:
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


@dataclass
class RunningDaemon:
    daemon: Daemon
    base_url: str
    session: aiohttp.ClientSession

    async def post_job(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(
            f"{self.base_url}/v1/jobs", json=body, headers={"Idempotency-Key": key}
        ) as r:
            assert r.status == 202, await r.text()
            return await r.json()  # type: ignore[no-any-return]

    async def get_job(self, job_id: int) -> dict[str, Any]:
        async with self.session.get(f"{self.base_url}/v1/jobs/{job_id}") as r:
            assert r.status == 200, await r.text()
            return await r.json()  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def running_daemon(
    settings: Settings, tracing: Tracing | None = None
) -> AsyncIterator[RunningDaemon]:
    daemon = Daemon(settings, tracing)
    task = asyncio.create_task(daemon.run(handle_signals=False))
    ready = asyncio.create_task(daemon.ready.wait())
    await asyncio.wait([task, ready], timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # raise the start-up error
    assert daemon.ready.is_set(), "daemon did not become ready"
    async with aiohttp.ClientSession() as session:
        try:
            yield RunningDaemon(daemon, f"http://{settings.listen}", session)
        finally:
            daemon.request_stop()
            assert await asyncio.wait_for(task, 30) == 0


@dataclass
class Target:
    """A loopback HTTP target that records every request and answers by a programmable rule."""

    respond: Callable[[web.Request, int], Awaitable[web.StreamResponse]] | None = None
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    url: str = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            body = await request.read()
            entry = {
                "key": request.headers.get("Idempotency-Key"),
                "at": time.monotonic(),
                "headers": dict(request.headers),
                "body": body,
                "path": request.path,
            }
            self.requests.append(entry)
            count = sum(1 for r in self.requests if r["key"] == entry["key"])
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.respond is not None:
                return await self.respond(request, count)
            return web.json_response({"ok": True})
        finally:
            self.inflight -= 1

    def request_keys(self) -> list[str]:
        return [r["key"] for r in self.requests]


@contextlib.asynccontextmanager
async def serve_target(target: Target, ssl_context: Any = None) -> AsyncIterator[Target]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", target._handle)
    # a short shutdown: requests a test left hanging must not hold up the cleanup
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    scheme = "https" if ssl_context else "http"
    target.url = f"{scheme}://127.0.0.1:{port}/hook"
    try:
        yield target
    finally:
        await runner.cleanup()


class DaemonProcess:
    """`dispatcher run` as a real child process, configured through the environment."""

    def __init__(self, env: dict[str, str], port: int | None = None):
        import os
        import sys

        self.port = port or free_port()
        self.env = {
            **os.environ,
            "DISPATCHER_LISTEN": f"127.0.0.1:{self.port}",
            "DISPATCHER_LOG_FORMAT": "json",
            **env,
        }
        self.env.setdefault("PYTHONPATH", str(__import__("pathlib").Path(__file__).parent.parent))
        self.argv = [sys.executable, "-m", "dispatcher.cli", "run"]
        self.proc: asyncio.subprocess.Process | None = None
        self.base_url = f"http://127.0.0.1:{self.port}"
        # a file, not a pipe: a chatty daemon must never block on a full pipe buffer
        self.log_path = __import__("pathlib").Path(
            __import__("tempfile").mkstemp(prefix="dispatcher-log-")[1]
        )

    async def start(self, wait_ready: bool = True) -> DaemonProcess:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdout=asyncio.subprocess.DEVNULL, stderr=log
            )
        if wait_ready:
            await wait_until(self.is_ready, timeout_s=60, interval_s=0.05, what="daemon ready")
        return self

    async def is_ready(self) -> bool:
        assert self.proc is not None
        if self.proc.returncode is not None:
            err = self.log_path.read_text()[-3000:]
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
        import signal as signals

        if self.proc is None or self.proc.returncode is not None:
            return self.proc.returncode if self.proc else 0  # type: ignore[return-value]
        self.signal(signals.SIGTERM)
        return await self.wait()


# daemon processes -----------------------------------------------------------------------------
# What a daemon under test needs to deliver to the loopback targets the tests serve, and to find
# due work quickly: the environment form of make_settings' defaults.
LOOPBACK_ENV = {
    "DISPATCHER_TARGET_ALLOW_HTTP": "true",
    "DISPATCHER_TARGET_ALLOW_CIDRS": "127.0.0.0/8",
    "DISPATCHER_SCAN_INTERVAL_S": "0.2",
}
# the embedded PostgreSQL runs initdb on first start; allow for a slow machine
EMBEDDED_READY_S = 120.0


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
        if daemon.proc is not None and daemon.proc.returncode is None:
            daemon.proc.kill()
            await daemon.proc.wait()


async def terminate(daemon: DaemonProcess) -> None:
    """SIGTERM, and a clean exit 0 within a minute."""
    import signal as signals

    daemon.signal(signals.SIGTERM)
    try:
        code = await daemon.wait(timeout_s=60)
    except TimeoutError:
        raise AssertionError("no exit 60 s after SIGTERM: " + daemon.log_text()[-3000:]) from None
    assert code == 0, daemon.log_text()[-3000:]
    assert "dispatcher stopped" in daemon.log_text()


async def post(daemon: DaemonProcess, key: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{daemon.base_url}/v1/jobs", json=body, headers={"Idempotency-Key": key}) as r,
    ):
        return r.status, await r.json(content_type=None)


async def get(daemon: DaemonProcess, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{daemon.base_url}{path}") as r:
        return r.status, await r.json(content_type=None)


# the command line -----------------------------------------------------------------------------
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
    proc = await asyncio.create_subprocess_exec(
        *command(),
        *args,
        cwd=cwd,
        env={**base, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
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
