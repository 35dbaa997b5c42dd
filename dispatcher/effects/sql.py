"""Configured SQL effects: a parameterized statement run in bounded pages.

Each page commits together with the job's progress; the last page (fewer rows than the page size)
commits together with the completion. A crash mid-way resumes at the next page, and a page that
was applied is never applied twice because its commit carries the progress that skips it.
The statement comes from configuration only, never from API input.
"""

from __future__ import annotations

from typing import Any

from dispatcher.config import HandlerSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.base import CompleteInTransaction, LeaseLost
from dispatcher.errors import Reject
from dispatcher.faults import fault_point
from dispatcher.model import Job


class SqlEffect:
    completes_in_transaction = True

    def __init__(self, name: str, settings: HandlerSettings, repo: JobRepository, owner: str):
        self.name = name
        self._statement = settings.statement or ""
        self._params = settings.params
        self._page_size = settings.page_size
        self._repo = repo
        self._owner = owner

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def arguments(self, payload: dict[str, Any]) -> list[Any]:
        missing = [p for p in self._params if p != "page_size" and p not in payload]
        if missing:
            raise Reject(f"payload lacks {missing} needed by handler {self.name!r}", code="invalid_payload")
        return [self._page_size if p == "page_size" else payload[p] for p in self._params]

    async def run(self, job: Job, complete: CompleteInTransaction) -> Any:
        args = self.arguments(job.payload)
        progress = dict(job.progress or {"pages": 0, "rows": 0})
        while True:
            async with self._repo.transaction() as conn:
                if not await self._repo.lock_running(conn, job, self._owner):
                    raise LeaseLost(f"job {job.id} attempt {job.attempt} is no longer ours")
                status = await conn.execute(self._statement, *args)
                affected = _affected_rows(status)
                progress = {"pages": progress["pages"] + 1, "rows": progress["rows"] + affected}
                if affected < self._page_size:
                    fault_point("sql_before_complete")
                    if not await complete(conn, job, progress):
                        raise LeaseLost(f"job {job.id} attempt {job.attempt} is no longer ours")
                    return progress
                await self._repo.save_progress(conn, job, self._owner, progress)
            fault_point("sql_after_page")


def _affected_rows(status: str) -> int:
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0
