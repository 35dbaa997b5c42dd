"""Configured SQL effects: a parameterized statement run in bounded pages.

Each page commits together with the job's progress; the last page (fewer rows than the page size)
commits together with the completion. A crash mid-way resumes at the next page, and a page that
was applied is never applied twice because its commit carries the progress that skips it.
The statement comes from configuration only, never from API input.

Cursor-paged handlers (`cursor = "id"` in the handler's configuration) page by a column instead
of re-running the same statement: the statement takes the last cursor (the `cursor` entry of
`params`: NULL on the first page, then the largest cursor of the previous page) and returns the
cursor column of every row it touched (`RETURNING id`). The effect runs it as

    WITH dispatcher_page AS (<statement>) SELECT count(*), greatest cursor FROM dispatcher_page

so the page's size and next cursor come back in one row, the greatest taken in the column's
own ordering (its collation for text, whatever the type) -- the ordering the statement's
`id > $n` compares in. Each page commits with the job's progress `{cursor, pages, rows}`; the
page that touches fewer than `page_size` rows commits with the completion. The job row is the
page's idempotency record: its key names the schedule, the period (the cutoff) and the unit
(the tenant or range), and a page from cursor C commits only under the job's row lock, lease
and attempt, together with the move of the recorded cursor past C. A crash loses at most the
page in flight (rolled back); the next attempt starts after the last committed cursor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from dispatcher.config.settings import HandlerSettings
from dispatcher.core.faults import fault_point
from dispatcher.db.jobs import JobRepository
from dispatcher.effects.base import CompleteInTransaction, complete_or_abort, leased_transaction
from dispatcher.errors import Reject
from dispatcher.model import Job

# One page: the rows it touched and the job's progress after it.
Page = tuple[int, dict[str, Any]]
PageRunner = Callable[[Any, Job, dict[str, Any]], Awaitable[Page]]


class SqlEffect:
    completes_in_transaction = True

    def __init__(self, name: str, settings: HandlerSettings, repo: JobRepository, owner: str):
        self.name = name
        self._statement = settings.statement or ""
        self._cursor = settings.cursor
        if self._cursor is not None:
            self._statement = paged_statement(self._statement, self._cursor)
        self._params = settings.params
        self._page_size = settings.page_size
        self._repo = repo
        self._owner = owner

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def arguments(self, payload: dict[str, Any], types: list[str], cursor: Any = None) -> list[Any]:
        """Bind payload values (JSON) to the statement's parameter types; refuse what won't fit.
        `page_size` is the handler's; `cursor` (cursor-paged handlers) the last page's."""
        given: dict[str, Any] = {"page_size": self._page_size}
        if self._cursor is not None:
            given["cursor"] = cursor
        missing = [p for p in self._params if p not in given and p not in payload]
        if missing:
            raise Reject(
                f"payload lacks {missing} needed by handler {self.name!r}", code="invalid_payload"
            )
        values = [given[p] if p in given else payload[p] for p in self._params]
        try:
            return [convert(v, t) for v, t in zip(values, types, strict=True)]
        except (TypeError, ValueError) as exc:
            raise Reject(
                f"payload does not fit handler {self.name!r}: {exc}", code="invalid_payload"
            ) from None

    async def run(self, job: Job, complete: CompleteInTransaction, conn: Any = None) -> Any:
        """Page until a page touches fewer than `page_size` rows: each page commits with the
        job's progress, the last with the completion (the module docstring says why)."""
        page: PageRunner
        if self._cursor is not None:
            progress = {"cursor": None, "pages": 0, "rows": 0, **(job.progress or {})}
            page = self._cursor_page
        else:
            progress = dict(job.progress or {"pages": 0, "rows": 0})
            page = self._statement_pages(job)
        while True:
            async with leased_transaction(conn, self._repo, job, self._owner):
                rows, progress = await page(conn, job, progress)
                if rows < self._page_size:
                    fault_point("sql_before_complete")
                    await complete_or_abort(complete, conn, job, progress)
                    return progress
                await self._repo.save_progress(conn, job, self._owner, progress)
            fault_point("sql_after_page")

    def _statement_pages(self, job: Job) -> PageRunner:
        """Pages that run the statement as it is; its arguments are bound once."""
        args: list[Any] | None = None

        async def page(conn: Any, job: Job, progress: dict[str, Any]) -> Page:
            nonlocal args
            statement = await conn.prepare(self._statement)
            if args is None:
                types = [t.name for t in statement.get_parameters()]
                args = self.arguments(job.payload, types)
            affected = _affected_rows(await _execute(statement, args))
            return affected, {"pages": progress["pages"] + 1, "rows": progress["rows"] + affected}

        return page

    async def _cursor_page(self, conn: Any, job: Job, progress: dict[str, Any]) -> Page:
        """One page from the last committed cursor; the progress records the next one."""
        statement = await self._prepare_paged(conn)
        types = [t.name for t in statement.get_parameters()]
        args = self.arguments(job.payload, types, progress["cursor"])
        rows, last = await statement.fetchrow(*args)
        cursor = self._next_cursor(rows, last, progress["cursor"])
        pages = progress["pages"] + 1
        return rows, {"cursor": cursor, "pages": pages, "rows": progress["rows"] + rows}

    async def _prepare_paged(self, conn: Any) -> Any:
        try:
            return await conn.prepare(self._statement)
        except Exception as exc:  # the driver's error; its SQLSTATE says whether it is ours
            state = getattr(exc, "sqlstate", None)
            if state == "0A000" or (state == "42703" and "dispatcher_page." in str(exc)):
                raise Reject(
                    f"handler {self.name!r}: the statement must return its cursor column "
                    f"{self._cursor!r} (end it with RETURNING {self._cursor}): {exc}",
                    code="invalid_statement",
                ) from None
            raise

    def _next_cursor(self, rows: int, last: Any, previous: Any) -> Any:
        """The cursor after this page (JSON, as progress stores it); refuse a page that
        touched full rows yet cannot move on (it would run forever)."""
        if rows == 0:
            return previous
        if last is None:
            raise Reject(
                f"handler {self.name!r}: the page returned {rows} rows but no {self._cursor!r} "
                "value (NULL); the cursor column must be non-NULL",
                code="invalid_statement",
            )
        cursor = cursor_json(last)
        if rows >= self._page_size and cursor == previous:
            raise Reject(
                f"handler {self.name!r}: a full page ended at cursor {cursor!r} again; the "
                f"statement must only touch rows after the cursor ({self._cursor} > $n)",
                code="invalid_statement",
            )
        return cursor


def paged_statement(statement: str, column: str) -> str:
    """`statement` wrapped so one row says how many rows it returned and the greatest cursor
    (NULLS LAST: a NULL is never taken for the greatest). The newline keeps a trailing comment
    in the statement from swallowing the closing parenthesis."""
    body = statement.strip().rstrip(";").rstrip()
    return (
        f"WITH dispatcher_page AS ({body}\n) "
        "SELECT (SELECT count(*) FROM dispatcher_page)::int AS rows, "
        f'(SELECT dispatcher_page."{column}" FROM dispatcher_page '
        "ORDER BY 1 DESC NULLS LAST LIMIT 1) AS next_cursor"
    )


def cursor_json(value: Any) -> Any:
    """A cursor value as progress stores it (JSON): numbers and text as they are, times in ISO
    8601, anything else (uuid, numeric) as text; `convert` turns it back for the parameter."""
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


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
