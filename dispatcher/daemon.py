"""The composition root: builds every component in order, runs until a signal, drains, tears down.

Read top to bottom, `Daemon.run` is the architecture: database → schema → repository → effects →
completer → worker pool → due-scan → wake-up listener → scheduler (interval scan, metric
sampling, cron) → HTTP API → READY. A signal only sets an event; the drain happens here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import uuid
from contextlib import AsyncExitStack
from datetime import UTC
from typing import Any

from aiohttp import web
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from dispatcher import metrics, sdnotify
from dispatcher.api.app import create_app, create_metrics_app
from dispatcher.config import Settings, host_port
from dispatcher.db import migrations
from dispatcher.db.embedded import EmbeddedPostgres
from dispatcher.db.jobs import JobRepository
from dispatcher.db.notifications import WakeListener
from dispatcher.db.pool import connect, create_pool, wait_for_database
from dispatcher.db.vacuum import vacuum_problems
from dispatcher.effects.base import Effect
from dispatcher.effects.http import HttpEffect
from dispatcher.effects.python import PythonEffect
from dispatcher.effects.sql import SqlEffect
from dispatcher.intake import Intake
from dispatcher.relay.transport import InProcessTransport
from dispatcher.scheduling.cron_service import CronService
from dispatcher.scheduling.due_scan import DueScanner
from dispatcher.scheduling.pruning import Pruner
from dispatcher.scheduling.sampler import MetricsSampler
from dispatcher.work.completer import Completer
from dispatcher.work.executor import Executor
from dispatcher.work.pool import QueueWorker, WorkerPool

log = logging.getLogger("dispatcher")

RELEASE_TIMEOUT_S = 5.0


def instance_owner(settings: Settings) -> str:
    """A lease owner unique to this process: readable host/pid plus a random suffix."""
    name = settings.instance_name or socket.gethostname()
    return f"{name}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def resolve_database(settings: Settings, stack: AsyncExitStack) -> str:
    """The configured URL, or the embedded server's (started now, stopped at exit)."""
    if settings.database_url is not None:
        log.info("using PostgreSQL from DISPATCHER_DATABASE_URL")
        return settings.database_url.get_secret_value()
    embedded = EmbeddedPostgres(settings.state_dir)
    dsn = await asyncio.to_thread(embedded.start)
    stack.callback(embedded.stop)
    return dsn


async def prepare_schema(dsn: str, settings: Settings) -> None:
    conn = await connect(dsn)
    try:
        if settings.auto_migrate:
            await migrations.migrate(conn)
        else:
            await migrations.check_current(conn)
        for problem in await vacuum_problems(conn):
            log.warning(problem)
    finally:
        await conn.close()


def build_effects(settings: Settings, repo: JobRepository, owner: str) -> dict[str, Effect]:
    ssl_context = None
    if settings.http.ca_file is not None:
        ssl_context = ssl.create_default_context()
        ssl_context.load_verify_locations(cafile=str(settings.http.ca_file))
    effects: dict[str, Effect] = {"http": HttpEffect(settings, ssl_context=ssl_context)}
    for name, handler in settings.handlers.items():
        kind = PythonEffect if handler.kind == "python" else SqlEffect
        effects[name] = kind(name, handler, repo, owner)
    return effects


def capabilities(settings: Settings) -> list[str]:
    """`handler:version` pairs this process can run (rolling releases share one database)."""
    caps = ["http:1"]
    for name, handler in settings.handlers.items():
        caps += [f"{name}:{v}" for v in handler.runnable_versions()]
    return caps


def every(scheduler: AsyncIOScheduler, func: Any, seconds: float, name: str) -> None:
    """A periodic APScheduler job that never overlaps itself and never catches up in a burst."""
    scheduler.add_job(func, "interval", seconds=seconds, max_instances=1, coalesce=True, id=name)


async def serve(app: web.Application, listen: str, stack: AsyncExitStack) -> None:
    """Bind `app` on `listen`; the daemon owns signals, so aiohttp must not install handlers."""
    # keepalive_timeout also bounds a connection that never finishes its headers (aiohttp has
    # no separate header timeout), so slow-loris clients are dropped after it.
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=5, keepalive_timeout=75
    )
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    host, port = host_port(listen)
    await web.TCPSite(runner, host, port, backlog=1024).start()


class Daemon:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.owner = instance_owner(settings)
        self.stop_requested = asyncio.Event()
        self.force_requested = asyncio.Event()
        self.draining = False
        self.ready = asyncio.Event()
        self._repo: JobRepository | None = None

    def request_stop(self) -> None:
        if self.stop_requested.is_set():
            log.warning("second stop signal: cancelling running attempts now")
            self.force_requested.set()
        else:
            log.info("stop signal: draining (up to %.0f s)", self.settings.drain_timeout_s)
            self.stop_requested.set()

    async def readiness(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if self._repo is None:
            return False, "starting"
        try:
            async with asyncio.timeout(2):
                async with self._repo.pool.acquire() as conn:
                    await migrations.check_current(conn)
        except Exception as exc:
            return False, f"database: {type(exc).__name__}: {exc}"
        return True, "ok"

    async def run(self, *, handle_signals: bool = True) -> int:
        s = self.settings
        if handle_signals:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.request_stop)
        async with AsyncExitStack() as stack:
            dsn = await resolve_database(s, stack)
            await wait_for_database(dsn, timeout_s=s.database_wait_s)
            await prepare_schema(dsn, s)
            pool = await create_pool(dsn, size=s.db_pool_size)
            stack.push_async_callback(pool.close)
            repo = self._repo = JobRepository(pool)
            await repo.sync_registry(
                {q: (c.max_attempts, c.max_retry_age_s) for q, c in s.queues.items()},
                {n: (h.kind, h.version) for n, h in s.handlers.items()},
            )

            effects = build_effects(s, repo, self.owner)
            for effect in effects.values():
                await effect.start()
                stack.push_async_callback(effect.stop)
            completer = Completer(repo, self.owner)
            await completer.start()
            stack.push_async_callback(completer.stop)

            def wake(reason: str = "") -> None:
                """Wake whom a change concerns: workers for ready work, the scan for due times.
                (Refers to `workers` and `scanner`, built below, when called.)"""
                if reason != "scheduled":
                    workers.wake()
                if reason != "ready":
                    scanner.wake()

            timeouts = {n: h.timeout_s for n, h in s.handlers.items()}
            transport = InProcessTransport(
                repo, owner=self.owner, capabilities=capabilities(s), lease_s=s.lease_s
            )
            workers = WorkerPool(
                [
                    QueueWorker(
                        q,
                        qs,
                        transport,
                        Executor(
                            q,
                            qs,
                            effects,
                            repo,
                            completer,
                            self.owner,
                            timeouts,
                            on_rescheduled=lambda: wake("scheduled"),
                        ),
                        idle_poll_s=s.scan_interval_s,
                    )
                    for q, qs in s.queues.items()
                ],
                repo,
                self.owner,
                s.lease_s,
            )
            await workers.start()
            stack.push_async_callback(workers.stop)

            scanner = DueScanner(
                repo, batch=s.scan_batch, interval_s=s.scan_interval_s, on_ready=workers.wake
            )
            await scanner.start()
            stack.push_async_callback(scanner.stop)

            listener = WakeListener(dsn, wake)
            await listener.start()
            stack.push_async_callback(listener.stop)

            scheduler = AsyncIOScheduler(timezone=UTC)
            every(scheduler, scanner.wake, s.scan_interval_s, "due-scan")
            every(scheduler, MetricsSampler(repo, s.overdue_after_s).run_once, 5, "sampler")
            every(scheduler, Pruner(repo, s.retention).run_once, s.retention.interval_s, "prune")
            scheduler.start()
            stack.callback(lambda: scheduler.running and scheduler.shutdown(wait=False))
            cron = CronService(pool, repo, s.schedules, scheduler=scheduler, on_enqueued=wake)
            await cron.start()
            stack.push_async_callback(cron.stop)

            intake = Intake(s, repo, lambda t: HttpEffect.validate_target(t, s), wake)
            app = create_app(
                repo=repo,
                intake=intake,
                readiness=self.readiness,
                tokens=s.all_api_tokens(),
                body_limit_bytes=s.body_limit_bytes,
                body_read_timeout_s=s.body_read_timeout_s,
                schedules=cron,
            )
            await serve(app, s.listen, stack)
            if s.metrics_listen is not None:
                await serve(create_metrics_app(self.readiness), s.metrics_listen, stack)

            watchdog = sdnotify.Watchdog()
            await watchdog.start()
            stack.push_async_callback(watchdog.stop)
            sdnotify.notify("READY=1")
            self.ready.set()
            log.info(
                "dispatcher ready on %s as %s (queues: %s)",
                s.listen,
                self.owner,
                ", ".join(s.queues),
            )

            await self.stop_requested.wait()
            sdnotify.notify("STOPPING=1")
            self.draining = True
            await cron.stop()
            if scheduler.running:
                scheduler.shutdown(wait=False)
            await scanner.stop()
            await listener.stop()
            await self._drain(workers, completer, repo)
        log.info("dispatcher stopped")
        return 0

    async def _drain(self, workers: WorkerPool, completer: Completer, repo: JobRepository) -> None:
        """Stop starting, let running attempts finish (bounded), hand the rest back."""
        await workers.stop_claiming()
        running = workers.inflight()
        if running:
            log.info("waiting for %d running attempts", running)
        unfinished = await workers.drain(self.settings.drain_timeout_s, self.force_requested)
        await completer.stop()
        if unfinished:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(RELEASE_TIMEOUT_S):
                    released = await repo.release_leases(unfinished, self.owner)
                    log.warning("released %d unfinished jobs back to ready", released)
        metrics.INFLIGHT.clear()
