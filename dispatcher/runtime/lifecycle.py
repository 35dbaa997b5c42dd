"""The service contract and the supervisor that composes services (periodic work runs on the
one timing engine, dispatcher.runtime.timing).

Every long-running part of the daemon is a `Service`: `start()` returns once it runs, `stop()` is
idempotent and returns once it has stopped. `ServiceGroup` starts services in the order given,
stops them in reverse, once, and watches their tasks: a task that ends while its service is meant
to run is a failure of the daemon, not a log line. It is logged with its traceback and `failed`
is set, so the daemon turns unready, drains what it can and exits non-zero for systemd or the
container runtime to restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

log = logging.getLogger("dispatcher")

OnDied = Callable[[str, BaseException | None], None]
DEFAULT_STOP_TIMEOUT_S = 15.0


class Service:
    """Base of every service. `spawn` starts a task under supervision: if it ends before
    `stop()` began (returned, raised, or was cancelled by someone else), the supervisor hears."""

    name = "service"
    # How long `ServiceGroup.stop` lets this service's stop() take before giving up on it.
    stop_timeout_s = DEFAULT_STOP_TIMEOUT_S

    _on_died: OnDied | None = None
    _stopping = False

    def supervise(self, on_died: OnDied) -> None:
        self._on_died = on_died

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self._stopping = True

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name or self.name)
        task.add_done_callback(self._task_ended)
        return task

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        if self._stopping:
            return
        error = None if task.cancelled() else task.exception()
        if self._on_died is not None:
            self._on_died(task.get_name(), error)
        elif error is not None:  # unsupervised (a test driving one service): still say it
            log.error("task %s failed", task.get_name(), exc_info=error)


class LoopService(Service, ABC):
    """A service that is one long-lived task (`_run`), cancelled on stop."""

    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._stopping = False
        self._task = self.spawn(self._run())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is None:
            return
        task, self._task = self._task, None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @abstractmethod
    async def _run(self) -> None:
        """The service's loop; it runs until cancelled."""


class CallbackService(Service):
    """A service made of a start and a stop function (a listener, a pool, a scheduler)."""

    def __init__(
        self,
        name: str,
        start: Callable[[], Awaitable[None]],
        stop: Callable[[], Awaitable[None]],
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    ):
        self.name = name
        self.stop_timeout_s = stop_timeout_s
        self._start = start
        self._stop = stop
        self._running = False

    async def start(self) -> None:
        await self._start()
        self._running = True

    async def stop(self) -> None:
        if self._running:
            self._running = False
            await self._stop()


class Startable(Protocol):
    """What the group needs of a service; `Service` subclasses add supervision of their tasks."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=Startable)


class ServiceGroup:
    """Starts services in order, stops them in reverse once, and supervises their tasks."""

    def __init__(self) -> None:
        self.failed = asyncio.Event()
        self.failure = ""
        self._started: list[Startable] = []

    async def start(self, service: S) -> S:
        if isinstance(service, Service):
            service.supervise(self._died)
        await service.start()
        self._started.append(service)
        return service

    def _died(self, task_name: str, error: BaseException | None) -> None:
        how = f"failed: {type(error).__name__}: {error}" if error else "ended unexpectedly"
        log.error("service task %s %s; stopping the daemon", task_name, how, exc_info=error)
        if not self.failed.is_set():
            self.failure = f"{task_name} {how}"
            self.failed.set()

    async def stop(self) -> bool:
        """Stop every started service, newest first, each bounded by its `stop_timeout_s`.
        Returns False if any stop failed or overran (already logged)."""
        clean = True
        while self._started:
            service = self._started.pop()
            name = getattr(service, "name", type(service).__name__)
            timeout_s = getattr(service, "stop_timeout_s", DEFAULT_STOP_TIMEOUT_S)
            try:
                async with asyncio.timeout(timeout_s):
                    await service.stop()
            except TimeoutError:
                log.error("stopping %s took over %.0f s; gave up on it", name, timeout_s)
                clean = False
            except Exception as exc:
                log.error("stopping %s failed: %s", name, exc)
                clean = False
        return clean
