"""The effects a daemon runs, built from its configuration: the HTTP effect and one effect per
configured handler, and the service that starts and stops them."""

from __future__ import annotations

import logging
import ssl

from dispatcher.config.settings import Settings
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.base import Effect
from dispatcher.effects.http import HttpEffect
from dispatcher.effects.python import PythonEffect
from dispatcher.effects.sql import SqlEffect
from dispatcher.runtime.lifecycle import CallbackService, Service

log = logging.getLogger("dispatcher")


def build_effects(
    settings: Settings, repo: JobRepository, owner: str, *, trace_context: bool = False
) -> dict[str, Effect]:
    ssl_context = None
    if settings.http.ca_file is not None:
        ssl_context = ssl.create_default_context()
        ssl_context.load_verify_locations(cafile=str(settings.http.ca_file))
    effects: dict[str, Effect] = {
        "http": HttpEffect(settings, ssl_context=ssl_context, trace_context=trace_context)
    }
    for name, handler in settings.handlers.items():
        kind = PythonEffect if handler.kind == "python" else SqlEffect
        effects[name] = kind(name, handler, repo, owner)
    return effects


def effect_service(effects: dict[str, Effect]) -> Service:
    async def start() -> None:
        for effect in effects.values():
            await effect.start()

    async def stop() -> None:
        for effect in effects.values():
            await effect.stop()

    return CallbackService("effects", start, stop)


def capabilities(settings: Settings) -> list[str]:
    """`handler:version` pairs this process can run (rolling releases share one database)."""
    caps = ["http:1"]
    for name, handler in settings.handlers.items():
        caps += [f"{name}:{v}" for v in handler.runnable_versions()]
    return caps


def log_handler_concurrency(settings: Settings, effects: dict[str, Effect]) -> None:
    """Say so when transactional handlers could want more connections than they have."""
    if not any(e.completes_in_transaction for e in effects.values()):
        return
    wanted = sum(q.max_inflight for q in settings.queues.values())
    size = settings.connection_budget().handlers
    if wanted > size:
        log.info(
            "transactional handlers: up to %d attempts may be in flight, but the handlers pool "
            "has %d connections; at most %d run at once and the rest wait for a connection "
            "(their timeout starts once they have one). Raise DISPATCHER_HANDLER_POOL_SIZE (and "
            "DISPATCHER_DATABASE_MAX_CONNECTIONS) to run more at once.",
            wanted,
            size,
            size,
        )
