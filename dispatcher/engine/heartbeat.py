"""The lease heartbeat: the leases of every attempt this process runs, extended in time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dispatcher.db.jobs import JobRepository
from dispatcher.model import AttemptKey
from dispatcher.runtime.lifecycle import LoopService

log = logging.getLogger(__name__)


class LeaseHeartbeat(LoopService):
    """Every `lease_s / 3`, extends the leases of the attempts this process runs.

    Its statement skips job rows another transaction holds locked: a transactional handler
    holds its own job's row for its whole run (and the lease rescuer skips such rows too), so
    the heartbeat of every other job never waits on a handler. It runs on a connection of its
    own, so no other work can keep it from the database either.
    """

    name = "lease-heartbeat"

    def __init__(
        self,
        repo: JobRepository,
        owner: str,
        lease_s: float,
        running: Callable[[], list[AttemptKey]],
    ):
        self._repo = repo
        self._owner = owner
        self._lease_s = lease_s
        self._running = running

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._lease_s / 3)
            await self.run_once()

    async def run_once(self) -> int:
        attempts = self._running()
        if not attempts:
            return 0
        try:  # a beat that cannot finish in its period is abandoned: the next one retries
            async with asyncio.timeout(self._lease_s / 3):
                return await self._repo.extend_leases(attempts, self._owner, self._lease_s)
        except Exception as exc:  # the lease has two more beats of slack
            log.error("could not extend %d leases: %s", len(attempts), exc)
            return 0
