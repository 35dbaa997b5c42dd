"""Restore safety (issue 20, defect 6 and Build 7; docs/recovery.md).

A daemon started while `dispatcher restore` fills an empty database died with a raw
`UniqueViolationError ... pg_namespace_nspname_index` traceback: its `CREATE SCHEMA IF NOT EXISTS`
waited on the restore's uncommitted schema, then collided with it. Now the restore holds the
migration lock for its whole transaction; a daemon arriving meanwhile says so and waits (bounded),
an operator command says so and exits non-zero, and a schema present only in part is refused in
one line. Real backups, real restores, real daemon processes.

To hold a restore in the middle deterministically, the test opens a transaction that creates
the `dispatcher` schema and keeps it open: the restore's own CREATE SCHEMA waits on it, inside
the restore's transaction, until the test rolls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg

from tests.conftest import scratch_database
from tests.harness import LOOPBACK_ENV, Result, cli, enqueue_noop_jobs, wait_until
from tests.harness.fixtures import Spawn

JOBS = 500


async def backup_of_jobs(db_url: str, tmp_path: Path) -> Path:
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=1)
    try:
        await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
        await enqueue_noop_jobs(pool, "restored", JOBS, due="'2031-01-01T00:00:00Z'::timestamptz")
    finally:
        await pool.close()
    dump = tmp_path / "jobs.dump"
    result = await cli("backup", str(dump), cwd=tmp_path, env={"DISPATCHER_DATABASE_URL": db_url})
    assert result.code == 0, result.stderr
    return dump


@contextlib.asynccontextmanager
async def restore_held(url: str, dump: Path, cwd: Path) -> AsyncIterator[asyncio.Task[Result]]:
    """`dispatcher restore` into the empty database at `url`, held inside its transaction (after
    it took the migration lock) until the block ends; yields the running command."""
    blocker = await asyncpg.connect(url)
    held = blocker.transaction()
    await held.start()
    await blocker.execute("CREATE SCHEMA dispatcher")  # uncommitted: the restore waits on it
    restore = asyncio.create_task(
        cli("restore", str(dump), cwd=cwd, env={"DISPATCHER_DATABASE_URL": url})
    )

    watcher = await asyncpg.connect(url)  # pg_stat_activity is frozen inside a transaction

    async def loading() -> bool:
        return bool(
            await watcher.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'CREATE SCHEMA dispatcher%' AND wait_event_type = 'Lock'"
            )
        )

    try:
        await wait_until(loading, timeout_s=60, what="the restore loading (held)")
        yield restore
    finally:
        await held.rollback()
        await blocker.close()
        await watcher.close()


WAITS = "a dispatcher restore is loading this database"


async def schema_waiters(url: str) -> int:
    """Sessions waiting on a lock in CREATE SCHEMA (the held restore, and anyone racing it)."""
    conn = await asyncpg.connect(url)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query ILIKE 'CREATE SCHEMA%dispatcher%' AND wait_event_type = 'Lock'"
            )
        )
    finally:
        await conn.close()


async def test_a_daemon_started_during_a_restore_waits_for_it_then_runs(
    db_url: str, server_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    dump = await backup_of_jobs(db_url, tmp_path)
    async with scratch_database(server_url, f"dispatcher_restoring_{os.getpid()}") as url:
        env = {"DISPATCHER_DATABASE_URL": url, **LOOPBACK_ENV}
        async with restore_held(url, dump, tmp_path) as restore:
            daemon = await spawn(env, wait_ready=False)

            async def arrived() -> bool:  # waiting: saying so, or (before) blocked silently
                return WAITS in daemon.log_text() or await schema_waiters(url) == 2

            await wait_until(arrived, timeout_s=60, what="the daemon at the schema step")
            assert daemon.proc is not None and daemon.proc.returncode is None
        result = await restore
        # before: the daemon's CREATE SCHEMA IF NOT EXISTS then collided with the restore's
        # (UniqueViolationError, exit 1), or the restore with the daemon's
        assert result.code == 0, result.stderr
        assert f"{JOBS} jobs" in result.stdout
        await wait_until(daemon.is_ready, timeout_s=60, what="the daemon ready after it")
        assert await daemon.stop() == 0
        assert WAITS in daemon.log_text()  # it said why it waited
        log = daemon.log_text()
        assert "Traceback" not in log and "UniqueViolation" not in log, log[-3000:]
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == JOBS
        finally:
            await conn.close()


async def test_a_bounded_wait_and_operator_commands_say_so_in_one_line(
    db_url: str, server_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    dump = await backup_of_jobs(db_url, tmp_path)
    async with scratch_database(server_url, f"dispatcher_restoring_{os.getpid()}") as url:
        env = {"DISPATCHER_DATABASE_URL": url, "DISPATCHER_DATABASE_WAIT_S": "1"}
        async with restore_held(url, dump, tmp_path) as restore:
            daemon = await spawn({**env, **LOOPBACK_ENV}, wait_ready=False)
            assert await daemon.wait(timeout_s=60) == 1
            (line,) = [
                json_line
                for json_line in daemon.log_text().splitlines()
                if json_line.startswith("dispatcher:")
            ]
            assert "a dispatcher restore is loading this database" in line, line
            assert "gave up after waiting 1 s" in line
            migrate = await cli("migrate", cwd=tmp_path, env=env)
            listing = await cli("jobs", "list", cwd=tmp_path, env=env)
            backup = await cli("backup", str(tmp_path / "during.dump"), cwd=tmp_path, env=env)
            again = await cli("restore", str(dump), cwd=tmp_path, env=env)
            for result, what in (
                (migrate, "gave up"),
                (listing, "try again once"),
                (backup, "try again once"),
                (again, "try again once"),
            ):
                assert result.code == 1, result
                assert "Traceback" not in result.stderr, result.stderr
                # one line ends it (migrate said first that it waits, as a log line)
                (line,) = [x for x in result.stderr.splitlines() if x.startswith("dispatcher:")]
                assert "a dispatcher restore is loading this database" in line and what in line
            assert "waiting (up to" in migrate.stderr
        assert (await restore).code == 0


async def test_a_half_restored_schema_is_refused_in_one_line(
    server_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    async with scratch_database(server_url, f"dispatcher_half_{os.getpid()}") as url:
        conn = await asyncpg.connect(url)
        try:  # what a pg_restore run by hand (no single transaction) leaves when it stops
            await conn.execute("CREATE SCHEMA dispatcher; CREATE TABLE dispatcher.intents (id int)")
        finally:
            await conn.close()
        env = {"DISPATCHER_DATABASE_URL": url}
        daemon = await spawn({**env, **LOOPBACK_ENV}, wait_ready=False)
        assert await daemon.wait(timeout_s=60) == 1
        log = daemon.log_text()
        assert "Traceback" not in log
        assert "dispatcher: the dispatcher schema is incomplete (1 tables" in log, log[-2000:]
        for args in (("migrate",), ("jobs", "list")):
            result = await cli(*args, cwd=tmp_path, env=env)
            assert result.code == 1, result
            (line,) = result.stderr.strip().splitlines()
            assert "the dispatcher schema is incomplete" in line, line
