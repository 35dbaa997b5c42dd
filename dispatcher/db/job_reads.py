"""The jobs repository's reads for the doors and the metrics: one job, its attempt history,
list pages, the queue registry and per-queue counts. Every one translates an unreachable
database into DatabaseUnavailable."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query
from dispatcher.model import JobFilter, JobPage, ListCursor, SearchedIds

# Without the trigram index (migration 039: pg_trgm could not be created), a last-error search
# looks at this many of the newest jobs only, so that it stays a bounded read of the primary key
# however large the table; the console and the docs say so.
ERROR_SCAN_ROWS = 100_000

# A key-prefix search first counts its matches below the cursor in its index
# (jobs_key_prefix_id, migration 042), up to this many. Fewer: it reads them all from the index,
# sorts them and reads the page's jobs by id (the whole answer, whatever their age). The count
# is paid by every key-prefix page with many matches, so it is kept small: at 10 million jobs
# counting 20,000 took 15-20 ms under load, 50,000 40-50 ms, and reading and sorting 111,111
# ids 43-58 ms (130 ms at p95 under load).
PREFIX_SCAN_IDS = 20_000
# More: each page looks at no more than this many ids, newest first from the cursor: the
# matches among them, and a cursor below them to search older jobs ("search older"), so that a
# prefix whose many matches are all old costs a bounded read per page, never a walk of the
# table (which took seconds at 10 million jobs): see docs/performance. Each id's key is read
# from the intents' heap (about 44 rows a page at 10 million jobs): 100,000 ids took 150 ms
# at the median under load when not cached; an index of (id) INCLUDE (key) read the same
# slice in 52 ms (index-only), at the cost of one more index entry per job (not built).
PREFIX_SLICE_IDS = 50_000


@dataclass(slots=True, frozen=True)
class IdSlice:
    """The ids a key-prefix page with many matches looks at: from `floor` (included) up to
    `top` (excluded), and whether any job is older than `floor`."""

    floor: int
    top: int
    older: bool

    @property
    def searched(self) -> SearchedIds:
        return SearchedIds(self.floor, self.top - 1)


def like_escaped(text: str) -> str:
    """`text` matching itself in a LIKE pattern (backslash is PostgreSQL's default escape)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def list_args(
    statement: str,
    f: JobFilter,
    cursor: ListCursor | None,
    limit: int,
    *,
    error_floor: int | None = None,
    slice_floor: int | None = None,
) -> tuple[Any, ...]:
    """The parameters of `statement` (list_jobs, newest first; list_jobs_by_due, a due window)
    for filter `f`, in their order: the one place that builds them, for the list and for bulk
    actions. `cursor`: the page after it (None: the first). `error_floor`: see
    `error_scan_floor`; `slice_floor`: a key prefix's `IdSlice.floor` (list_jobs only; None:
    the search is not bounded, as for a bulk action)."""
    common = (f.key, f.tenant, f.run_key, f.handler, f.due_before, f.due_after, f.dead_reason)
    searches = (
        None if f.key_prefix is None else like_escaped(f.key_prefix) + "%",
        None if f.error is None else "%" + like_escaped(f.error) + "%",
        None if f.error is None else error_floor,
        f.concurrency_key,
    )
    if statement == "list_jobs_by_due":
        after_due = cursor.due_at if cursor is not None else None
        after_id = cursor.id if cursor is not None else None
        return (f.state, f.queue, after_due, limit, *common, after_id, f.priority, *searches)
    if statement != "list_jobs":
        raise ValueError(f"not a list statement: {statement}")
    before_id = cursor.id if cursor is not None else None
    prefix_bounds = (PREFIX_SCAN_IDS, slice_floor)
    return (f.state, f.queue, before_id, limit, *common, f.priority, *searches, *prefix_bounds)


async def error_scan_floor(db: asyncpg.Pool | asyncpg.Connection, f: JobFilter) -> int | None:
    """For a filter with `error`: None when the trigram index serves the search, else the id
    above which the newest ERROR_SCAN_ROWS jobs are (whether the index exists is looked up each
    time: a concurrent build may add it at any time, and the lookup is one catalog read)."""
    if f.error is None or await db.fetchval(query("error_search_indexed")):
        return None
    return int(await db.fetchval(query("error_scan_floor"), ERROR_SCAN_ROWS))


async def prefix_slice(
    db: asyncpg.Pool | asyncpg.Connection, f: JobFilter, cursor: ListCursor | None
) -> IdSlice | None:
    """For a newest-first list with `key_prefix`: None when fewer than PREFIX_SCAN_IDS keys
    below the cursor match (the index serves them all), else the ids this page looks at, the
    PREFIX_SLICE_IDS below the cursor (the newest job's id + 1 when there is none)."""
    if f.key_prefix is None or f.by_due:
        return None
    below = cursor.id if cursor is not None else None
    pattern = like_escaped(f.key_prefix) + "%"
    extent = await db.fetchrow(query("prefix_extent"), pattern, below, PREFIX_SCAN_IDS)
    if extent["matches"] < PREFIX_SCAN_IDS:
        return None
    # a cursor above the newest job (no page gives one) must not send a client through
    # slices of ids that hold no job
    top = min(below, extent["newest"] + 1) if below is not None else extent["newest"] + 1
    floor = top - PREFIX_SLICE_IDS
    return IdSlice(floor, top, older=floor > extent["oldest"])


class JobReads:
    """Reads of jobs and queues; changes nothing."""

    pool: asyncpg.Pool

    @translate_unavailable
    async def get(self, job_id: int) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(query("get_job"), job_id)
        return dict(row) if row else None

    @translate_unavailable
    async def get_page(self, job_id: int, shown_bytes: int) -> dict[str, Any] | None:
        """One job for a page that shows it: `get`'s columns, the payload whole when it is at
        most `shown_bytes` (else its first `shown_bytes` characters, `payload_excerpt`), its
        size (`payload_bytes`), and the target when it is at most `shown_bytes`."""
        row = await self.pool.fetchrow(query("get_job_page"), job_id, shown_bytes)
        return dict(row) if row else None

    @translate_unavailable
    async def attempts(
        self, job_id: int, *, before_id: int | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The attempt history of one job, newest first (`before_id`: the page after the
        history row with that id). Empty for an unknown job as for one never attempted."""
        rows = await self.pool.fetch(query("list_attempts"), job_id, before_id, limit)
        return [dict(r) for r in rows]

    @translate_unavailable
    async def get_by_key(self, key: str) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(query("get_job_by_key"), key)
        return dict(row) if row else None

    @translate_unavailable
    async def list_summaries(
        self, filters: JobFilter, *, cursor: ListCursor | None, limit: int
    ) -> JobPage:
        """A page of the list: the columns of a list view, with `last_error` cut to 500
        characters (never payload, target, result or progress, which may each be near the
        body limit); newest first, or earliest due first for a due window
        (`JobFilter.by_due`). A key prefix with many matches looks at PREFIX_SLICE_IDS ids at
        most (`prefix_slice`): its page may then hold fewer rows than `limit`, or none, and
        says which ids it looked at (`JobPage.searched`)."""
        statement = "list_jobs_by_due" if filters.by_due else "list_jobs"
        floor = await error_scan_floor(self.pool, filters)
        ids = await prefix_slice(self.pool, filters, cursor)
        if ids is None:
            args = list_args(statement, filters, cursor, limit, error_floor=floor)
            return JobPage([dict(r) for r in await self.pool.fetch(query(statement), *args)])
        args = list_args(
            statement, filters, ListCursor(ids.top), limit, error_floor=floor, slice_floor=ids.floor
        )
        rows = [dict(r) for r in await self.pool.fetch(query(statement), *args)]
        stopped_at_bound = len(rows) < limit and ids.older
        return JobPage(rows, ids.searched if stopped_at_bound else None)

    @translate_unavailable
    async def error_search_indexed(self) -> bool:
        """Whether a last-error search reads every job (its trigram index exists) or only the
        newest ERROR_SCAN_ROWS."""
        return bool(await self.pool.fetchval(query("error_search_indexed")))

    @translate_unavailable
    async def now(self) -> datetime:
        """The database clock."""
        return await self.pool.fetchval(query("now"))  # type: ignore[no-any-return]

    @translate_unavailable
    async def list_queues(self) -> list[dict[str, Any]]:
        """The queue registry (every queue any daemon on this database configured)."""
        return [dict(r) for r in await self.pool.fetch(query("list_queues"))]

    @translate_unavailable
    async def dead_letter_groups(self, per_queue: int) -> list[dict[str, Any]]:
        """Dead letters by queue and reason among each queue's newest `per_queue` (the
        console): `n`, `newest`, `oldest` per group, the most recent group first."""
        return [dict(r) for r in await self.pool.fetch(query("dead_letter_groups"), per_queue)]

    @translate_unavailable  # also read by the queue overview (GET /v1/queues)
    async def estimated_jobs(self) -> float:
        return await self.pool.fetchval(query("estimated_jobs")) or 0.0

    @translate_unavailable  # also read by the queue overview (GET /v1/queues)
    async def estimate_by_state(self, total: float) -> list[tuple[str, str, int]]:
        rows = await self.pool.fetch(query("estimate_by_state"), total)
        return [(r["queue"], r["state"], r["n"]) for r in rows]

    @translate_unavailable  # also read by the queue overview (GET /v1/queues)
    async def counts_by_state(self) -> list[tuple[str, str, int]]:
        rows = await self.pool.fetch(query("count_by_state"))
        return [(r["queue"], r["state"], r["n"]) for r in rows]

    @translate_unavailable  # also read by the queue overview (GET /v1/queues)
    async def oldest_ready_age(self) -> dict[str, float]:
        rows = await self.pool.fetch(query("oldest_ready_age"))
        return {r["queue"]: r["age_s"] for r in rows}

    @translate_unavailable  # also read by the queue overview (GET /v1/queues)
    async def count_overdue(self, overdue_after_s: float) -> dict[str, int]:
        rows = await self.pool.fetch(query("count_overdue"), overdue_after_s)
        return {r["queue"]: r["n"] for r in rows}
