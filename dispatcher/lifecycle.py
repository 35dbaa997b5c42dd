"""The start/stop contract of background services.

`start()` returns once the service runs; `stop()` is idempotent and returns once it has fully
stopped. A `LoopService` runs one long-lived task (`_run`), cancelled on stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod


class LoopService(ABC):
    name = "service"

    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is None:
            return
        task, self._task = self._task, None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    @abstractmethod
    async def _run(self) -> None:
        """The service's loop; it runs until cancelled."""
