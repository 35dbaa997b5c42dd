"""Python handlers named `module:function` in config: `async def handler(job, ctx)`.

A transactional handler (the default) gets `ctx.connection`, the connection of the transaction
that also records the job's completion: its database writes and `succeeded` commit together or
not at all, so a redelivery after a crash finds either nothing done or everything done.
A handler that raises or returns `Snooze` runs again later without spending an attempt.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from dispatcher.config.settings import HandlerSettings, Settings
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.base import CompleteInTransaction, complete_or_abort, leased_transaction
from dispatcher.errors import ConfigError, Reject, RetryLater, Snooze
from dispatcher.model import Job

Handler = Callable[[Job, "HandlerContext"], Awaitable[Any]]


@dataclass(slots=True, frozen=True)
class HandlerContext:
    """What a handler gets besides the job. Frozen: non-transactional attempts of a handler
    share one."""

    connection: Any  # asyncpg connection in the completion's transaction; None if not transactional
    handler: str

    @staticmethod
    def retry_later(reason: str, delay_s: float | None = None) -> NoReturn:
        raise RetryLater(reason, delay_s)

    @staticmethod
    def snooze(
        delay_s: float | None = None, *, until: datetime | None = None, reason: str = ""
    ) -> NoReturn:
        """Run again later without spending an attempt (dispatcher.errors.Snooze)."""
        raise Snooze(delay_s, until=until, reason=reason)

    @staticmethod
    def reject(reason: str) -> NoReturn:
        raise Reject(reason, code="rejected_by_handler")


def load_handler(name: str, spec: str) -> Handler:
    module_name, _, attr = spec.partition(":")
    setting = f"setting handlers.{name}.function = {spec!r}"
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{setting}: cannot load ({exc}); {import_advice(module_name, exc)}"
        ) from None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{setting}: cannot load ({exc})") from None
    if not inspect.iscoroutinefunction(function):
        raise ConfigError(f"setting handlers.{name}.function = {spec!r}: must be `async def`")
    return function  # type: ignore[no-any-return]


def import_advice(module_name: str, exc: ModuleNotFoundError) -> str:
    """Where Python looked for a handler's module and how to make it find it.

    The `dispatcher` command is a console script: Python puts the script's own directory first
    on sys.path, not the current directory, so `myapp.py` beside the configuration is not found
    until its directory is on PYTHONPATH (or the package is installed in the daemon's venv)."""
    top = module_name.split(".")[0]
    missing = exc.name or module_name
    if module_name != missing and not module_name.startswith(missing + "."):
        # the handler's module was found; something it imports was not
        return f"{module_name} imports {exc.name!r}: install it in the daemon's environment"
    searched = [p or os.getcwd() for p in sys.path]
    here = Path.cwd()
    if (here / f"{top}.py").exists() or (here / top / "__init__.py").exists():
        hint = (
            f"{top!r} is in the current directory {here}, which is not on the import path: "
            f"start the daemon with PYTHONPATH={here}"
        )
    else:
        hint = (
            "put the directory that holds it on PYTHONPATH (e.g. PYTHONPATH=/srv/app dispatcher "
            "run; systemd: Environment=PYTHONPATH=/srv/app) or pip install its package into the "
            "daemon's environment"
        )
    return f"{hint}. Searched: {os.pathsep.join(searched)}"


def verify_handlers(settings: Settings) -> None:
    """Import every configured python handler now, so a typo stops start-up before any change."""
    for name, handler in settings.handlers.items():
        if handler.kind == "python":
            load_handler(name, handler.function or "")


class PythonEffect:
    def __init__(self, name: str, settings: HandlerSettings, repo: JobRepository, owner: str):
        self.name = name
        self.completes_in_transaction = settings.transactional
        self._handler = load_handler(name, settings.function or "")
        self._repo = repo
        self._owner = owner
        self._shared_context = HandlerContext(None, name)  # non-transactional: nothing per job

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def run(self, job: Job, complete: CompleteInTransaction, conn: Any = None) -> Any:
        if not self.completes_in_transaction:
            return await self._handler(job, self._shared_context)
        async with leased_transaction(conn, self._repo, job, self._owner):
            result = await self._handler(job, HandlerContext(conn, self.name))
            if isinstance(result, Snooze):  # nothing completed: the handler's writes roll back
                raise result
            await complete_or_abort(complete, conn, job, result)
            return result
