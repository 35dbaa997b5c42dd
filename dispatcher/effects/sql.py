"""Configured SQL effects: a parameterized statement run in bounded pages.

Each page commits together with the job's progress; the last page (fewer rows than the page size)
commits together with the completion. A crash mid-way resumes at the next page, and a page that
was applied is never applied twice because its commit carries the progress that skips it.
The statement comes from configuration only, never from API input.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from dispatcher.config import HandlerSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.base import CompleteInTransaction, complete_or_abort, leased_transaction
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

    def arguments(self, payload: dict[str, Any], types: list[str]) -> list[Any]:
        """Bind payload values (JSON) to the statement's parameter types; refuse what won't fit."""
        missing = [p for p in self._params if p != "page_size" and p not in payload]
        if missing:
            raise Reject(
                f"payload lacks {missing} needed by handler {self.name!r}", code="invalid_payload"
            )
        values = [self._page_size if p == "page_size" else payload[p] for p in self._params]
        try:
            return [convert(v, t) for v, t in zip(values, types, strict=True)]
        except (TypeError, ValueError) as exc:
            raise Reject(
                f"payload does not fit handler {self.name!r}: {exc}", code="invalid_payload"
            ) from None

    async def run(self, job: Job, complete: CompleteInTransaction, conn: Any = None) -> Any:
        progress = dict(job.progress or {"pages": 0, "rows": 0})
        args: list[Any] | None = None
        while True:
            async with leased_transaction(conn, self._repo, job, self._owner):
                statement = await conn.prepare(self._statement)
                if args is None:
                    types = [t.name for t in statement.get_parameters()]
                    args = self.arguments(job.payload, types)
                status = await _execute(statement, args)
                affected = _affected_rows(status)
                progress = {"pages": progress["pages"] + 1, "rows": progress["rows"] + affected}
                if affected < self._page_size:
                    fault_point("sql_before_complete")
                    await complete_or_abort(complete, conn, job, progress)
                    return progress
                await self._repo.save_progress(conn, job, self._owner, progress)
            fault_point("sql_after_page")


async def _execute(statement: Any, args: list[Any]) -> str:
    await statement.fetch(*args)
    return statement.get_statusmsg() or ""


def convert(value: Any, type_name: str) -> Any:
    """A JSON value as the Python type the driver expects for a parameter of `type_name`."""
    if value is None or type_name in ("json", "jsonb"):
        return value
    if type_name in ("timestamptz", "timestamp"):
        return value if isinstance(value, datetime) else datetime.fromisoformat(value)
    if type_name == "date":
        return date.fromisoformat(value)
    if type_name in ("int2", "int4", "int8"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TypeError(f"{value!r} is not an integer")
        return int(value)
    if type_name in ("float4", "float8"):
        return float(value)
    if type_name == "numeric":
        return Decimal(str(value))
    if type_name == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"{value!r} is not a boolean")
        return value
    if type_name == "uuid":
        return UUID(str(value))
    if type_name.startswith("_"):  # arrays
        return [convert(v, type_name[1:]) for v in value]
    return value if isinstance(value, str) else str(value)


def _affected_rows(status: str) -> int:
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0
