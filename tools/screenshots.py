"""Screenshots of every console page for the documentation (docs/guides/console.md).

Starts a real daemon with real data (three queues, one of them paused; two schedules with runs;
dead letters; a job running against a target that holds it; jobs due later), signs in with a
headless Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium, no network)
and saves one PNG per page:

    python -m tools.screenshots                      # embedded PostgreSQL in a temporary dir
    python -m tools.screenshots --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python -m tools.screenshots --only jobs,job      # some pages only

With a server URL it creates (and at the end drops) a scratch database `dispatcher_screenshots`
on it. Pages change often; rerun this after changing one: it takes about a minute and rewrites
docs/screenshots/console-*.png (the guide links those names).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"
SCRATCH_DB = "dispatcher_screenshots"
WINDOW = (1280, 900)
# No network here or in CI: nothing Chromium would fetch for itself may be tried.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--hide-scrollbars",
)
CONFIG = """
[queues.default]
[queues.emails]
rate_per_s = 20.0
burst = 20
max_inflight = 4
[queues.reports]
max_inflight = 2

[[schedules]]
name = "nightly-report"
cron = "30 2 * * *"
timezone = "Europe/Berlin"
handler = "http"
queue = "reports"
fanout = {{ tenants = ["acme", "globex", "initech"] }}
target = {{ url = "{target}/report" }}

[[schedules]]
name = "hourly-sync"
cron = "0 * * * *"
handler = "http"
fanout = {{ ranges = 4, key_space = [0, 1024] }}
target = {{ url = "{target}/sync" }}
"""
# (name, path): {job} is the running job's id
PAGES = (
    ("sign-in", "/console/login"),
    ("overview", "/console/"),
    ("history", "/console/"),  # the overview's history charts alone
    ("jobs", "/console/jobs"),
    ("job", "/console/jobs/{job}"),
    ("queue", "/console/queues/reports"),
    ("schedules", "/console/schedules"),
    ("dead-letters", "/console/dead"),
)


# the loopback target -----------------------------------------------------------------------
async def target_app(release: asyncio.Event) -> web.Application:
    """Refuses keys starting with 'bad-' (400: the job dies at once) and 'flaky-' (503: dies
    when its attempts are used up), holds keys starting with 'slow-' until `release` (a
    running job to look at), answers 200 to the rest."""

    async def respond(request: web.Request) -> web.StreamResponse:
        key = request.headers.get("Idempotency-Key", "")
        if key.startswith("bad-"):
            return web.Response(status=400, text="unknown customer id: 'cus_0000'")
        if key.startswith("flaky-"):
            return web.Response(status=503, text="upstream maintenance")
        if key.startswith("slow-"):
            await release.wait()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", respond)
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving_target() -> AsyncIterator[tuple[str, asyncio.Event]]:
    release = asyncio.Event()
    runner = web.AppRunner(await target_app(release))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", release
    finally:
        release.set()
        await runner.cleanup()


# the database and the daemon ---------------------------------------------------------------
@contextlib.asynccontextmanager
async def scratch_database(server_url: str | None) -> AsyncIterator[str | None]:
    """A fresh database on `server_url` (dropped at the end), or None: embedded PostgreSQL."""
    if server_url is None:
        yield None
        return
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {SCRATCH_DB}")
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{SCRATCH_DB}"))
    finally:
        await conn.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB} WITH (FORCE)")
        await conn.close()


@contextlib.asynccontextmanager
async def running_daemon(
    workdir: Path, db_url: str | None, target: str, token: str
) -> AsyncIterator[str]:
    """`dispatcher run` as a child process; yields its base URL once /readyz answers 200."""
    config = workdir / "dispatcher.toml"
    config.write_text(CONFIG.format(target=target))
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DISPATCHER_CONFIG": str(config),
        "DISPATCHER_STATE_DIR": str(workdir / "state"),
        "DISPATCHER_LISTEN": f"127.0.0.1:{port}",
        "DISPATCHER_API_TOKENS": f"{token} read,enqueue,operate # docs",
        "DISPATCHER_TARGET_ALLOW_HTTP": "true",
        "DISPATCHER_TARGET_ALLOW_CIDRS": "127.0.0.0/8",
        "DISPATCHER_DRAIN_TIMEOUT_S": "5",
    }
    if db_url is not None:
        env["DISPATCHER_DATABASE_URL"] = db_url
    else:
        env.pop("DISPATCHER_DATABASE_URL", None)
    log = (workdir / "daemon.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dispatcher.cli", "run", env=env, stdout=log, stderr=log
    )
    base = f"http://127.0.0.1:{port}"
    try:
        await until(lambda: ready(base, proc), 180, "the daemon to be ready")
        yield base
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 60)
        log.close()


async def ready(base: str, proc: asyncio.subprocess.Process) -> bool:
    if proc.returncode is not None:
        raise SystemExit(f"the daemon exited with {proc.returncode}; see its log")
    try:
        async with aiohttp.ClientSession() as s, s.get(f"{base}/readyz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


# the data ------------------------------------------------------------------------------------
class Api:
    def __init__(self, base: str, token: str, target: str):
        self.base, self.target = base, target
        self.headers = {"Authorization": f"Bearer {token}"}

    async def call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        async with (
            aiohttp.ClientSession() as s,
            s.request(
                method, self.base + path, json=body, headers={**self.headers, **headers}
            ) as r,
        ):
            answer = await r.json(content_type=None)
            if r.status >= 300:
                raise SystemExit(f"{method} {path}: {r.status} {answer}")
            return answer

    async def enqueue(
        self, key: str, queue: str, *, target: dict[str, Any] | None = None, **fields: Any
    ) -> int:
        body = {
            "handler": "http",
            "target": {"url": f"{self.target}/{queue}", **(target or {})},
            "queue": queue,
            **fields,
        }
        job = await self.call("POST", "/v1/jobs", body, **{"Idempotency-Key": key})
        return int(job["id"])

    async def count(self, state: str) -> int:
        found = await self.call("GET", f"/v1/jobs?state={state}&limit=100")
        return len(found["items"])


async def seed(api: Api) -> int:
    """The data the pages show; returns the id of the job left running."""
    await api.call("POST", "/v1/queues/reports/pause")
    later = (datetime.now(UTC) + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for n in range(1, 13):
        await api.enqueue(f"welcome-email:user-{4100 + n}", "emails", tenant=f"shop-{n % 3}",
                          payload={"user": 4100 + n, "template": "welcome"})  # fmt: skip
    for n in range(1, 4):
        await api.enqueue(f"bad-invoice:{n}", "emails", tenant="shop-1", payload={"n": n})
    for n in range(1, 3):
        await api.enqueue(f"flaky-webhook:{n}", "default", max_attempts=1, payload={"n": n})
    for n in range(1, 6):
        await api.enqueue(f"renewal-reminder:{n}", "default", due_at=later, payload={"n": n})
    # held by the target for as long as the screenshots take; its credentials show masked
    running = await api.enqueue(
        "slow-export:2026-q4",
        "reports",
        tenant="acme",
        payload={"format": "csv", "quarter": "2026-Q4", "rows": 184_220},
        target={"headers": {"Authorization": "Bearer example-secret"}, "timeout_s": 600},
    )
    await api.call("POST", "/v1/queues/reports/resume")
    for n in range(1, 4):
        await api.enqueue(f"monthly-report:{n}", "default", payload={"month": n})
    schedules = (await api.call("GET", "/v1/schedules"))["schedules"]
    for s in schedules:
        if s.get("current_period"):
            await api.call(
                "POST", f"/v1/schedules/{s['name']}/trigger", {"period_start": s["current_period"]}
            )
    await api.call("POST", "/v1/schedules/nightly-report/pause")

    async def settled() -> bool:
        job = await api.call("GET", f"/v1/jobs/{running}")
        return job["state"] == "running" and await api.count("dead") >= 5

    await until(settled, 60, "the seeded jobs to settle")
    # a paused queue keeps accepting: its jobs wait as ready
    await api.call("POST", "/v1/queues/reports/pause")
    for tenant in ("globex", "initech"):
        await api.enqueue(f"export:{tenant}:2026-q4", "reports", tenant=tenant)
    return running


# the browser ---------------------------------------------------------------------------------
def chromium() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        raise SystemExit("needs Debian's chromium and chromium-driver (apt-get install both)")
    options = Options()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def shoot(base: str, token: str, job: int, out: Path, only: set[str]) -> list[Path]:
    """Sign in and save each page of PAGES (or of `only`) as out/console-NAME.png."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as until_
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium()
    saved: list[Path] = []
    try:
        driver.set_page_load_timeout(30)
        wait = WebDriverWait(driver, 20)
        for name, path in PAGES:
            driver.get(base + path.format(job=job))
            if name == "sign-in":
                if name in only:
                    saved.append(save(driver, out, name))
                driver.find_element(By.ID, "token").send_keys(token)
                driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
                wait.until(until_.presence_of_element_located((By.ID, "queues")))
                continue
            if name not in only:
                continue
            if name in ("overview", "history"):  # the daemon has flushed its first counts:
                # the server draws the charts, console.js fetches them again every 10 s
                WebDriverWait(driver, 60).until(
                    lambda d: not d.find_element(By.ID, "history-totals").text.startswith("0 ")
                )
            if name == "history":  # the charts alone
                path = out / f"console-{name}.png"
                driver.find_element(By.ID, "history").screenshot(str(path))
                saved.append(path)
                continue
            saved.append(save(driver, out, name))
    finally:
        driver.quit()
    return saved


def save(driver: Any, out: Path, name: str) -> Path:
    path = out / f"console-{name}.png"
    driver.execute_script("window.scrollTo(0, 0); document.activeElement.blur()")
    driver.save_screenshot(str(path))
    return path


# the whole run -------------------------------------------------------------------------------
async def run(server_url: str | None, out: Path, only: set[str]) -> list[Path]:
    token = secrets.token_urlsafe(24)  # this run's only; never written anywhere
    with tempfile.TemporaryDirectory(prefix="dispatcher-shots-") as tmp:
        async with (
            serving_target() as (target, release),
            scratch_database(server_url) as db_url,
            running_daemon(Path(tmp), db_url, target, token) as base,
        ):
            job = await seed(Api(base, token, target))
            saved = await asyncio.to_thread(shoot, base, token, job, out, only)
            release.set()  # the running job ends, so the daemon drains at once
            return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.screenshots", description=__doc__)
    parser.add_argument(
        "--database-url",
        help="a PostgreSQL server to create a scratch database on (default: embedded PostgreSQL)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT})")
    parser.add_argument(
        "--only", help="comma-separated page names: " + ", ".join(name for name, _ in PAGES)
    )
    args = parser.parse_args(argv)
    names = {name for name, _ in PAGES}
    only = set(args.only.split(",")) if args.only else names
    if unknown := only - names:
        parser.error(f"unknown page(s) {', '.join(sorted(unknown))}; pages: {', '.join(names)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(run(args.database_url, args.out, only)):
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
              f"{path.stat().st_size // 1024} KB")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
