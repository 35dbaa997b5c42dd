"""Waiting on the rows a daemon writes: a NOTIFY for every statement that changes the jobs table.

The daemon sends no NOTIFY when a job finishes (its `dispatcher_wake` channel tells daemons about
new work), so `job_changes` adds a test-only statement trigger to the test's own database that
notifies `CHANNEL` after each INSERT, UPDATE or DELETE on the jobs' states (`dispatcher.job_state`,
the table under the `dispatcher.jobs` view), and LISTENs on it.
A wait checks its condition once at the start and again after each notification: it wakes when
a row changes, not on a timer, and a change made between the check and the wait is not lost
(LISTEN is on before the first check; the event is cleared before each check).

One NOTIFY per statement, not per row, keeps the daemon's batches cheap; PostgreSQL folds equal
notifications of one transaction into one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import asyncpg

from tests.harness.waits import wait_signalled

CHANNEL = "test_jobs_changed"
_INSTALL = f"""
CREATE OR REPLACE FUNCTION public.test_jobs_changed() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$;
CREATE OR REPLACE TRIGGER test_jobs_changed
    AFTER INSERT OR UPDATE OR DELETE ON dispatcher.job_state
    FOR EACH STATEMENT EXECUTE FUNCTION public.test_jobs_changed();
"""

_INSTALLED = "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'test_jobs_changed')"


class JobChanges:
    """A LISTENing connection to the test database, woken by every change of the jobs table."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.changed = asyncio.Event()

    async def until(
        self,
        check: Callable[[asyncpg.Connection], Awaitable[bool]],
        timeout_s: float = 30.0,
        what: str = "a change of the jobs",
    ) -> None:
        """Until `check(conn)` holds, re-checked after each change of the jobs table."""
        await wait_signalled(self.changed, lambda: check(self.conn), timeout_s, what)

    async def states(self) -> dict[str, int]:
        rows = await self.conn.fetch(
            "SELECT state, count(*) AS n FROM dispatcher.jobs GROUP BY state"
        )
        return {r["state"]: r["n"] for r in rows}

    async def until_states(self, expected: dict[str, int], timeout_s: float = 30.0) -> None:
        """Until the jobs' state counts are exactly `expected` (states not named: none)."""
        seen: list[dict[str, int]] = [{}]

        async def reached(_: asyncpg.Connection) -> bool:
            seen[0] = await self.states()
            return seen[0] == expected

        try:
            await self.until(reached, timeout_s, f"job states {expected}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen {seen[0]}") from None

    async def until_keys(
        self, expected: Mapping[str, str | tuple[str, ...]], timeout_s: float = 20.0
    ) -> None:
        """Until each job, by key, is in its state (or one of a tuple of states)."""
        seen: dict[str, str] = {}

        async def reached(conn: asyncpg.Connection) -> bool:
            rows = await conn.fetch(
                "SELECT key, state FROM dispatcher.jobs WHERE key = ANY($1)", list(expected)
            )
            seen.clear()
            seen.update({r["key"]: r["state"] for r in rows})
            wanted = {k: (v,) if isinstance(v, str) else v for k, v in expected.items()}
            return all(seen.get(key) in states for key, states in wanted.items())

        try:
            await self.until(reached, timeout_s, f"jobs in states {dict(expected)}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last seen {seen}") from None

    async def until_count(
        self, state: str, count: int, timeout_s: float = 30.0, *, at_least: bool = False
    ) -> None:
        """Until exactly `count` jobs are in `state` (other states may hold the rest), or at
        least `count` with `at_least`."""

        async def reached(conn: asyncpg.Connection) -> bool:
            n = await conn.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE state = $1", state)
            return bool(n >= count if at_least else n == count)

        what = f"{'at least ' if at_least else ''}{count} jobs {state}"
        await self.until(reached, timeout_s, what)


@contextlib.asynccontextmanager
async def job_changes(db_url: str) -> AsyncIterator[JobChanges]:
    """LISTEN for changes of `dispatcher.jobs` on the test database `db_url` (a migrated one)."""
    conn = await asyncpg.connect(db_url)
    try:
        if not await conn.fetchval(_INSTALLED):  # (two installs at once would collide)
            await conn.execute(_INSTALL)
        watch = JobChanges(conn)
        await conn.add_listener(CHANNEL, lambda *_: watch.changed.set())
        yield watch
    finally:
        await conn.close()


async def until_job_states(db_url: str, expected: dict[str, int], timeout_s: float = 20.0) -> None:
    """Until the jobs' state counts are exactly `expected`: `JobChanges.until_states` at once."""
    async with job_changes(db_url) as jobs:
        await jobs.until_states(expected, timeout_s)


async def until_job_keys(
    db_url: str, expected: Mapping[str, str | tuple[str, ...]], timeout_s: float = 20.0
) -> None:
    """Until each job, by key, is in its state: `JobChanges.until_keys` at once."""
    async with job_changes(db_url) as jobs:
        await jobs.until_keys(expected, timeout_s)


async def until_job_count(
    db_url: str, state: str, count: int, timeout_s: float = 20.0, *, at_least: bool = False
) -> None:
    """Until exactly (or `at_least`) `count` jobs are in `state`: `JobChanges.until_count` at
    once."""
    async with job_changes(db_url) as jobs:
        await jobs.until_count(state, count, timeout_s, at_least=at_least)
