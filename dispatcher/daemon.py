"""The composition root: every service of the daemon, in the one order they start in.

`Daemon.run` starts the database and its pools, then `Daemon.services` in list order, reports
READY, and waits for a stop signal or for a supervised service to die; then it stops everything
in reverse order, once (`ServiceGroup.stop`). The drain is the worker pool's stop: soft stop
(`drain_timeout_s`), then hard stop (`hard_stop_timeout_s`), then the leases handed back. The
API listener starts before the workers and so stops after them: during a drain `/readyz` says
"draining" and job status stays readable. A signal only sets an event.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web

from dispatcher.api.app import create_app, create_metrics_app
from dispatcher.api.listener import HttpListener, check_can_listen
from dispatcher.api.tls import ServerTls
from dispatcher.config.settings import Settings
from dispatcher.console import web as console
from dispatcher.cron.service import CronService
from dispatcher.db import schema
from dispatcher.db.claims import ClaimConnections
from dispatcher.db.history import HistoryStore
from dispatcher.db.jobs import JobRepository
from dispatcher.db.liveness import LivenessLock, liveness_lock
from dispatcher.db.notifications import WakeListener
from dispatcher.db.pool import PoolSet
from dispatcher.db.queue_limits import QueueSettingsRepository
from dispatcher.db.relay import RelayRepository
from dispatcher.effects.base import Effect
from dispatcher.effects.http import HttpEffect, dead_letter_target
from dispatcher.effects.registry import (
    build_effects,
    capabilities,
    effect_service,
    log_handler_concurrency,
)
from dispatcher.engine.budget import PayloadBudget
from dispatcher.engine.completer import Completer
from dispatcher.engine.due_scan import DueScanner
from dispatcher.engine.executor import Executor
from dispatcher.engine.gone_owners import GoneOwners
from dispatcher.engine.heartbeat import LeaseHeartbeat
from dispatcher.engine.history import FLUSH_INTERVAL_S, HistoryRecorder
from dispatcher.engine.live_settings import INTERVAL_S as LIVE_INTERVAL_S
from dispatcher.engine.live_settings import LiveSettings
from dispatcher.engine.pruning import Pruner
from dispatcher.engine.queue_worker import QueueWorker
from dispatcher.engine.sampler import MetricsSampler
from dispatcher.engine.wake_gates import QueueGate, WakeGates
from dispatcher.engine.work_poll import (
    CLAIM_LOOP_IDLE_S,
    DUE_SCAN_IDLE_S,
    Wakeups,
    WorkPoller,
    poll_interval_s,
)
from dispatcher.engine.worker_pool import WorkerPool
from dispatcher.intake.accept import Intake
from dispatcher.observability.tracing import Tracing
from dispatcher.operator.queue_limits import file_settings
from dispatcher.operator.service import Operator
from dispatcher.relay.transport import InProcessTransport, Transport
from dispatcher.runtime import sdnotify
from dispatcher.runtime.database import Database, tracing_service
from dispatcher.runtime.diskspace import CHECK_INTERVAL_S, DiskSpace
from dispatcher.runtime.lifecycle import Service, ServiceGroup, Startable
from dispatcher.runtime.timing import TimingEngine

LIVE_SETTINGS_JOB = "queue-settings"
log = logging.getLogger("dispatcher")

SAMPLE_INTERVAL_S = 5.0


def instance_owner(settings: Settings) -> str:
    """A lease owner unique to this process: readable host/pid plus a random suffix."""
    name = settings.instance_name or socket.gethostname()
    return f"{name}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Daemon:
    def __init__(self, settings: Settings, tracing: Tracing | None = None):
        self.settings = settings
        self.tracing = (
            tracing  # None: tracing off (dispatcher.observability.tracing.from_environment)
        )
        self.owner = instance_owner(settings)
        self.stop_requested = asyncio.Event()
        self.force_requested = asyncio.Event()
        self.draining = False
        self.ready = asyncio.Event()
        self._group = ServiceGroup()
        self._repo: JobRepository | None = None
        self._claims: ClaimConnections | None = None  # their problem makes the daemon unready
        self._disk: DiskSpace | None = None  # the embedded database's filesystem
        self._liveness: LivenessLock | None = None  # crash recovery in seconds (recovery.md)
        self._broker: list[Service] = []  # RabbitMQ link and relay (transport = "rabbitmq")
        # RabbitMQ: a max_inflight changed at run time moves the prefetch and the publish window
        self._on_max_inflight: Callable[[str, int], Awaitable[None]] | None = None
        # an idle relay waits for this (ready work: a wake-up or the work poll finding some)
        self._relay_wake: Callable[[], None] = lambda: None
        self._tls: ServerTls | None = None
        self._http: HttpEffect | None = None  # its signing secrets are reloaded on SIGHUP
        if settings.tls.cert_file is not None and settings.tls.key_file is not None:
            self._tls = ServerTls(settings.tls.cert_file, settings.tls.key_file)

    def reload(self) -> None:
        """SIGHUP: load the TLS certificate again (after a renewal) and the signing secrets
        (after a rotation); the listeners stay up, the pushes in flight go on."""
        secrets_file = self.settings.http.signing_secret_file
        if self._tls is None and secrets_file is None:
            log.info("SIGHUP: nothing to reload (no TLS, no http.signing_secret_file)")
        if self._tls is not None:
            self._tls.reload()
        if secrets_file is not None and self._http is not None:
            self._http.reload_secrets()

    def request_stop(self) -> None:
        if self.stop_requested.is_set():
            log.warning("second stop signal: cancelling running attempts now")
            self.force_requested.set()
        else:
            log.info("stop signal: draining (up to %.0f s)", self.settings.drain_timeout_s)
            self.stop_requested.set()

    async def readiness(self) -> tuple[bool, str]:
        if self._group.failed.is_set():
            return False, f"failed: {self._group.failure}"
        if self.draining:
            return False, "draining"
        disk_problem = self._disk.problem() if self._disk is not None else None
        if disk_problem is not None:
            return False, disk_problem
        liveness_problem = self._liveness.problem() if self._liveness is not None else None
        if liveness_problem is not None:
            return False, liveness_problem
        if self._repo is None or not self.ready.is_set():
            return False, "starting"
        starved = self._claims.problem() if self._claims is not None else None
        if starved is not None:
            return False, starved
        # the broker down is degraded, not unready: intake and the due-scan still work
        problems = (getattr(b, "problem", None) for b in self._broker)
        degraded: str | None = next((p for p in problems if p), None)
        try:
            async with asyncio.timeout(2):
                async with self._repo.pool.acquire() as conn:
                    await schema.check_current(conn)
        except Exception as exc:
            return False, f"database: {type(exc).__name__}: {exc}"
        return True, f"ok; degraded: {degraded}" if degraded else "ok"

    async def run(self, *, handle_signals: bool = True) -> int:
        """Start everything, run until a stop signal or a service failure, stop everything.
        Returns the exit status: 0 after a clean drain, 1 after a failure or an unclean stop."""
        if handle_signals:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.request_stop)
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        check_can_listen(self.settings.listen, "DISPATCHER_LISTEN")
        if self.settings.metrics_listen is not None:
            check_can_listen(self.settings.metrics_listen, "DISPATCHER_METRICS_LISTEN")
        if self.settings.console_listen is not None:
            check_can_listen(self.settings.console_listen, "DISPATCHER_CONSOLE_LISTEN")
        group = self._group
        try:
            database = await group.start(Database(self.settings))
            pools = await group.start(self._pools(database.dsn))
            for service in await self.services(database.dsn, pools):
                await group.start(service)
            sdnotify.notify("READY=1")
            self.ready.set()
            log.info("dispatcher ready on %s as %s", self.settings.listen, self.owner)
            stop = asyncio.ensure_future(self.stop_requested.wait())
            failed = asyncio.ensure_future(group.failed.wait())
            await asyncio.wait([stop, failed], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            failed.cancel()
        finally:
            self.draining = True
            sdnotify.notify("STOPPING=1")
            clean = await group.stop()
        if group.failed.is_set():
            log.error("dispatcher stopped after a failure (%s); exit 1", group.failure)
            return 1
        if not clean:
            log.error("dispatcher stopped, but not cleanly (see above); exit 1")
            return 1
        log.info("dispatcher stopped")
        return 0

    def _pools(self, dsn: str) -> PoolSet:
        budget = self.settings.connection_budget()  # whatever the number of queues
        log.info("database connections at most %s", budget.describe())
        return PoolSet(dsn, budget, pooled=self.settings.database.pooled)

    async def _sync_registry(self, engine: JobRepository) -> None:
        """The configured queues, limits, handlers and the SQL door's settings, written to the
        database (the SQL door and every daemon's claims read them there)."""
        s = self.settings
        await engine.sync_registry(
            {q: (c.max_attempts, c.max_retry_age_s) for q, c in s.queues.items()},
            {n: (h.kind, h.version) for n, h in s.handlers.items()},
            {
                q: (dead_letter_target(s, q), c.on_dead.queue if c.on_dead else None)
                for q, c in s.queues.items()
            },
            {q: (c.rate_per_s, c.burst, c.max_inflight) for q, c in s.queues.items()},
            due_at_past_tolerance_s=s.due_at_past_tolerance_s,  # for the SQL door (011)
            ready_outbox=s.transport == "rabbitmq",  # the relay publishes outbox rows (015)
            # a job's own deadline is at most its handler's: the SQL door checks it (030)
            max_timeout_s={n: h.timeout_s for n, h in s.handlers.items()},
            max_payload_bytes=s.limits.max_payload_bytes,  # for the SQL door (029)
            groups={g: c.limits() for g, c in s.limit_groups.items()},  # shared budgets (024)
            membership={q: (c.limit_group, c.group_priority) for q, c in s.queues.items()},
            key_limits={q: c.key_limits() for q, c in s.queues.items()},  # per key (024)
        )

    async def services(self, dsn: str, pools: PoolSet) -> list[Startable]:
        """Every service after the database, in start order (they stop in reverse)."""
        s = self.settings
        repo = self._repo = JobRepository(pools["api"])
        engine = JobRepository(pools["engine"])
        await self._sync_registry(engine)
        effects = build_effects(s, engine, self.owner, trace_context=self.tracing is not None)
        self._http = cast(HttpEffect, effects["http"])
        log_handler_concurrency(s, effects)
        completer = Completer(engine, self.owner)
        wake = Wakeups()
        claims = self._claims = ClaimConnections(pools["claims"], pools.budget.claims)
        handlers = JobRepository(pools["handlers"])
        wake_listener = WakeListener(dsn, wake) if s.database.wakeups == "listen" else None
        # a claim loop about to wait holds its queue's gate, so intake notifies only then; over
        # RabbitMQ the relays wait for ready work, and every ready intake notifies
        gates = None
        if wake_listener is not None and s.transport != "rabbitmq":
            gates = WakeGates(wake_listener, claims, capabilities(s))
        workers = self._workers(effects, engine, claims, handlers, completer, wake, gates)
        judge = GoneOwners()  # which other daemons died: their running jobs are rescued
        timing = TimingEngine()  # when every periodic job, wake-up and cron fire runs
        scanner, poller = self._due_scan_and_poll(engine, timing, workers, judge, wake)
        self._liveness = liveness_lock(s, dsn, self.owner, judge, on_gone=scanner.wake)
        await self._live_settings(QueueSettingsRepository(pools["engine"]), workers, timing)
        wake.bind(
            workers,
            scanner,
            poller,
            settings=lambda: timing.run_now(LIVE_SETTINGS_JOB),
            relay=self._relay_wake,
        )
        cron = CronService(pools["engine"], engine, s.schedules, timing=timing, on_enqueued=wake)
        disk = await self._disk_space()
        # one sampler for the gauges and the queue overview (GET /v1/queues), which share its
        # samples; on the API's pool, as an operator read
        sampler = MetricsSampler(repo, s.overdue_after_s)
        api = self._api(repo, wake, disk, sampler, cron)
        # this daemon's counts, added to the cluster's per-minute history every few seconds
        recorder = HistoryRecorder(
            HistoryStore(engine.pool), lambda: sampler.ready_ages(2 * SAMPLE_INTERVAL_S)
        )
        services: list[Startable] = [
            tracing_service(self.tracing),  # stops after every other service: spans flushed
            # before the first claim, released after the last lease
            *([self._liveness] if self._liveness else []),
            effect_service(effects),
            recorder,  # its last flush after the completer's: every outcome counted
            completer,
            HttpListener(
                "api", api, s.listen, "DISPATCHER_LISTEN", self._tls.context if self._tls else None
            ),
            LeaseHeartbeat(
                JobRepository(pools["lease"]), self.owner, s.lease_s, workers.running_attempts
            ),
            *self._broker,  # the RabbitMQ link and relay: up before the consumers, down after
            timing,  # up before the jobs on it (the scan, cron), down after them
            claims,  # handed back once every claim loop has stopped
            workers,
            scanner,
            poller,
            *([wake_listener] if wake_listener is not None else []),
            cron,
            sdnotify.Watchdog(),
        ]
        timing.every("metrics-sampler", SAMPLE_INTERVAL_S, sampler.run_once)
        timing.every("history", FLUSH_INTERVAL_S, recorder.run_once)
        timing.every("pruner", s.retention.interval_s, Pruner(engine, s.retention).run_once)
        if disk is not None:
            timing.every("disk-space", CHECK_INTERVAL_S, disk.run_once)
        services += self._console(api)
        if s.metrics_listen is not None:
            metrics_app = create_metrics_app(self.readiness)
            listener = HttpListener(
                "metrics", metrics_app, s.metrics_listen, "DISPATCHER_METRICS_LISTEN"
            )
            services.insert(4, listener)  # before the API listener
        return services

    def _due_scan_and_poll(
        self,
        engine: JobRepository,
        timing: TimingEngine,
        workers: WorkerPool,
        judge: GoneOwners,
        wake: Wakeups,
    ) -> tuple[DueScanner, WorkPoller]:
        """The due-scan (scheduled -> ready, rescue of gone daemons' jobs) and the work poll
        (which queues have ready work), both on the timing engine."""
        s = self.settings
        scanner = DueScanner(
            engine,
            timing,
            batch=s.scan_batch,
            interval_s=max(s.scan_interval_s, DUE_SCAN_IDLE_S),  # the work poll looks before
            on_ready=lambda: wake("ready"),  # as a notice: the work poll first with many queues
            gone_owners=judge.confirmed,
            ahead_s=s.scan_ahead_s,
        )

        def wake_queue(queue: str) -> None:  # ready work: its claim loop, and an idle relay
            workers.wake_queue(queue)
            self._relay_wake()

        poller = WorkPoller(
            engine,
            timing,
            queues=list(s.queues),
            capabilities=capabilities(s),
            interval_s=poll_interval_s(s),
            wake_queue=wake_queue,
            scanner=scanner,
        )
        return scanner, poller

    async def _live_settings(
        self, store: QueueSettingsRepository, workers: WorkerPool, timing: TimingEngine
    ) -> None:
        """Record the file's live queue settings, apply the run-time overrides before the first
        claim, then every second and on each NOTIFY 'limits' (docs/guides/run-windows.md)."""
        await store.record_file_settings(
            {q: file_settings(c) for q, c in self.settings.queues.items()}
        )
        live = LiveSettings(store, workers.workers, self._on_max_inflight)
        await live.run_once()
        timing.every(LIVE_SETTINGS_JOB, LIVE_INTERVAL_S, live.run_once)

    def _api(
        self,
        repo: JobRepository,
        wake: Wakeups,
        disk: DiskSpace | None,
        sampler: MetricsSampler,
        cron: CronService,
    ) -> web.Application:
        """The API application: intake, and the operator service the API, the console and the
        CLI share (dispatcher.operator.service)."""
        s = self.settings
        refusal = disk.problem if disk is not None else lambda: None
        intake = Intake(
            s, repo, lambda t: HttpEffect.validate_target(t, s), wake, refusal, self.tracing
        )
        operator = Operator(
            repo, s, sampler=sampler, schedules=cron, on_ready=intake.notify_accepted
        )
        return create_app(
            repo=repo,
            intake=intake,
            readiness=self.readiness,
            tokens=s.api_token_entries(),
            body_limit_bytes=s.body_limit_bytes,
            body_read_timeout_s=s.body_read_timeout_s,
            settings=s,
            operator=operator,
        )

    def _console(self, api: web.Application) -> list[Startable]:
        """The web console: under /console/ on the API listener, or on its own listener."""
        s = self.settings
        services: list[Startable] = []
        if s.console_listen is None:
            console.mount(api, s.console_session_s)
        else:
            tls = self._tls.context if self._tls else None
            app = console.standalone(api, s.console_session_s)
            services.append(
                HttpListener("console", app, s.console_listen, "DISPATCHER_CONSOLE_LISTEN", tls)
            )
        return services

    async def _disk_space(self) -> DiskSpace | None:
        """The embedded database's free space, looked at once now (so a daemon that starts on
        a full disk is unready from its first answer), then every second."""
        if self.settings.database_url is not None:
            return None
        reserve = self.settings.state_dir_min_free_mb * 1024 * 1024
        self._disk = DiskSpace(self.settings.state_dir.absolute(), reserve)
        await self._disk.run_once()
        return self._disk

    def _rabbit_transport(self, engine: JobRepository, claims: ClaimConnections) -> Transport:
        """The RabbitMQ link and outbox relay, kept as broker services (started before the
        consumers), and the transport the claim loops consume through."""
        from dispatcher.relay.rabbitmq.broker import Broker  # aio_pika only when it is used

        s = self.settings
        relays = RelayRepository(engine.pool)
        broker = Broker(s, relays, claims, owner=self.owner, capabilities=capabilities(s))
        self._broker = broker.services
        self._relay_wake = broker.relay.wake
        self._on_max_inflight = broker.retune
        return broker.transport

    def _workers(
        self,
        effects: dict[str, Effect],
        engine: JobRepository,
        claims: ClaimConnections,
        handlers: JobRepository,
        completer: Completer,
        wake: Wakeups,
        gates: QueueGate | None,
    ) -> WorkerPool:
        s = self.settings
        timeouts = {n: h.timeout_s for n, h in s.handlers.items()}
        transport: Transport = InProcessTransport(
            claims, owner=self.owner, capabilities=capabilities(s), lease_s=s.lease_s
        )
        if s.transport == "rabbitmq":
            transport = self._rabbit_transport(engine, claims)

        def executor(queue: str) -> Executor:
            return Executor(
                queue,
                s.queues[queue],
                effects,
                engine,
                completer,
                self.owner,
                timeouts,
                on_rescheduled=lambda: wake("scheduled"),
                handler_repo=handlers,
                tracing=self.tracing,
            )

        budget = PayloadBudget(s.max_inflight_payload_bytes)  # one for all queues
        workers = [
            QueueWorker(
                q,
                qs,
                transport,
                executor(q),
                idle_poll_s=CLAIM_LOOP_IDLE_S,
                budget=budget,
                gate=gates,
            )
            for q, qs in s.queues.items()
        ]
        return WorkerPool(
            workers,
            engine,
            self.owner,
            drain_timeout_s=s.drain_timeout_s,
            hard_stop_timeout_s=s.hard_stop_timeout_s,
            force=self.force_requested,
        )
