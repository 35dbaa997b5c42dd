"""`dispatcher backup` / `restore` on the configured server (the session's: embedded PostgreSQL 18,
or the external one in DATABASE_URL, e.g. 15): a newer pg_dump's archive loads into that server,
jobs keep their ids and idempotency keys, and a failed restore changes nothing."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import create_pool
from dispatcher.model import NewJob
from tests.conftest import scratch_database
from tests.harness import cli


async def add_jobs(url: str, keys: list[str]) -> dict[str, int]:
    pool = await create_pool(url, size=2)
    try:
        due = datetime(2031, 1, 1, tzinfo=UTC)
        items = [NewJob(key=k, handler="http", payload={"k": k}, due_at=due) for k in keys]
        items = [
            NewJob(
                key=i.key,
                handler="http",
                payload=i.payload,
                due_at=due,
                target={"url": "https://hooks.example.com/x"},
            )
            for i in items
        ]
        return {r.key: r.id for r in await JobRepository(pool).enqueue_many(items)}
    finally:
        await pool.close()


async def jobs_in(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        return {r["key"]: r["id"] for r in await conn.fetch("SELECT key, id FROM dispatcher.jobs")}
    finally:
        await conn.close()


async def test_backup_and_restore_on_the_configured_server(
    db_url: str, server_url: str, tmp_path: Path
) -> None:
    ids = await add_jobs(db_url, ["a", "b", "c"])
    dump = tmp_path / "jobs.dump"
    result = await cli("backup", str(dump), cwd=tmp_path, env={"DISPATCHER_DATABASE_URL": db_url})
    assert result.code == 0, result.stderr

    name = f"dispatcher_restore_{os.getpid()}"
    async with scratch_database(server_url, name) as target:
        env = {"DISPATCHER_DATABASE_URL": target}
        result = await cli("restore", str(dump), cwd=tmp_path, env=env)
        assert result.code == 0, result.stderr
        assert "3 jobs" in result.stdout
        assert await jobs_in(target) == ids

        # an idempotent replay against the restored database finds the same jobs
        assert await add_jobs(target, ["a", "b"]) == {"a": ids["a"], "b": ids["b"]}

        # a damaged archive fails whole, even forced: the restored jobs are still there
        data = dump.read_bytes()
        for cut in (0.5, 0.8, 0.95, 0.99):
            broken = tmp_path / f"broken-{cut}.dump"
            broken.write_bytes(data[: int(len(data) * cut)])
            result = await cli("restore", str(broken), "--force", cwd=tmp_path, env=env)
            assert result.code == 1, (cut, result.stdout)
            assert "nothing was restored" in result.stderr or "not a backup" in result.stderr
            assert await jobs_in(target) == ids, cut


async def trigram_index(url: str) -> str | None:
    """The last-error search's trigram index as the catalog defines it, or None."""
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(  # type: ignore[no-any-return]
            "SELECT pg_get_indexdef(to_regclass('dispatcher.jobs_last_error_trgm'))"
        )
    finally:
        await conn.close()


async def test_a_restore_makes_the_trigram_index_where_pg_trgm_may_be_and_goes_on_without_it(
    db_url: str, server_url: str, tmp_path: Path
) -> None:
    """A backup holds the dispatcher schema, not pg_trgm (migration 039's last-error index uses
    its operator class): the restore makes the index in whatever schema pg_trgm has there, and
    where pg_trgm cannot be created (here: no schema `public` to create it in) restores the
    jobs without the index."""
    if await trigram_index(db_url) is None:
        pytest.skip("this server has no pg_trgm (contrib): the backup holds no trigram index")
    ids = await add_jobs(db_url, ["a", "b"])
    dump = tmp_path / "jobs.dump"
    result = await cli("backup", str(dump), cwd=tmp_path, env={"DISPATCHER_DATABASE_URL": db_url})
    assert result.code == 0, result.stderr

    for prepare, expected in (
        ("CREATE SCHEMA ext; CREATE EXTENSION pg_trgm SCHEMA ext", "ext.gin_trgm_ops"),
        ("DROP SCHEMA public CASCADE", None),
    ):
        name = f"dispatcher_restore_trgm_{os.getpid()}"
        async with scratch_database(server_url, name) as target:
            conn = await asyncpg.connect(target)
            try:
                await conn.execute(prepare)
            finally:
                await conn.close()
            result = await cli("restore", str(dump), cwd=tmp_path, env={
                "DISPATCHER_DATABASE_URL": target})  # fmt: skip
            assert result.code == 0, (prepare, result.stderr)
            assert await jobs_in(target) == ids
            made = await trigram_index(target)
            if expected is None:
                assert made is None, made
            else:
                assert made is not None and expected in made, made
