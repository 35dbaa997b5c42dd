"""Queue settings changed at run time, honoured by this daemon: every second, and at once when
a change is announced (NOTIFY 'limits', migration 025), read every queue's settings in force and
apply them to this daemon's claim loops (token bucket, in-flight cap, run windows). The global
limits need no such look: claim_grant reads them from the queue's row at every claim.

The run-window gauge (`dispatcher_queue_window_open`) is set here too, for the queues this
daemon claims from."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from dispatcher.db.queue_limits import QueueSettingsRepository
from dispatcher.engine.limiter import InflightLimit, TokenBucket
from dispatcher.engine.windows import RunWindows, retune
from dispatcher.observability import metrics

log = logging.getLogger(__name__)

INTERVAL_S = 1.0  # every change holds within this, even when its notice was lost


class Tunable(Protocol):
    """What a claim loop exposes to be retuned (dispatcher.engine.queue_worker.QueueWorker)."""

    queue: str
    bucket: TokenBucket
    inflight: InflightLimit
    windows: RunWindows


class LiveSettings:
    """Applies the settings in force to `workers` (by queue name) in `run_once()`."""

    def __init__(
        self,
        repo: QueueSettingsRepository,
        workers: Mapping[str, Tunable],
        on_max_inflight: Callable[[str, int], Awaitable[None]] | None = None,
    ):
        self._repo = repo
        self._workers = workers
        # the transport's own share of a cap (RabbitMQ: the prefetch and the publish window)
        self._on_max_inflight = on_max_inflight
        self._applied: dict[str, dict[str, object]] = {}
        self._refused: dict[str, dict[str, object]] = {}

    async def run_once(self) -> None:
        for row in await self._repo.all():
            worker = self._workers.get(row.name)
            if worker is None:
                continue  # another daemon's queue
            effective = row.effective
            if self._applied.get(row.name) != effective:
                try:
                    retune(effective, worker.bucket, worker.inflight, worker.windows)
                except ValueError as exc:  # refused at every door; a hand-edited row: say so
                    if self._refused.get(row.name) != effective:  # once, not every second
                        log.error("queue %s: settings in force not applied: %s", row.name, exc)
                        self._refused[row.name] = effective
                    continue
                if row.name in self._applied:
                    log.info("queue %s: settings in force now %s", row.name, effective)
                self._applied[row.name] = effective
                if self._on_max_inflight is not None and "max_inflight" in effective:
                    await self._on_max_inflight(row.name, int(effective["max_inflight"]))
        for queue, worker in self._workers.items():
            metrics.QUEUE_WINDOW_OPEN.labels(queue).set(1 if worker.windows.state().open else 0)
