"""A new user's first hour with the embedded database: an operator command run from the wrong
directory finds no database and says where it looked (it never creates an empty one there);
`dispatcher db-url` tells how to reach the daemon's database with psql while the daemon runs.
Real `dispatcher` processes on a real embedded PostgreSQL, with no DISPATCHER_DATABASE_URL."""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path

import asyncpg
import pytest

from dispatcher.config.settings import mask_url
from tests.harness import Result, cli, daemon_on, no_server_left, run_cli, terminate

pytestmark = pytest.mark.timeout(300)

# every command that reads or operates the database, none of which may create one
READERS = [
    ("status",),
    ("jobs", "list"),
    ("jobs", "show", "1"),
    ("jobs", "redrive", "--all", "--dry-run"),
    ("queues",),
    ("schedules",),
    ("catch-up", "nightly", "--from", "2026-05-30T02:00:00Z", "--to", "2026-05-30T02:00:00Z"),
    ("backup", "out.dump"),
    ("db-url",),
]


def says_where_it_looked(result: Result, state: Path) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.code == 1 and len(lines) == 1, result
    line = lines[0]
    assert f"no embedded database in {state}" in line, line
    for words in ("nothing was created", "DISPATCHER_STATE_DIR", "DISPATCHER_DATABASE_URL"):
        assert words in line, line
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", READERS, ids=lambda a: " ".join(a[:2]))
async def test_a_command_in_a_directory_without_a_database_creates_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    result = await cli(*args, cwd=tmp_path)  # no DISPATCHER_STATE_DIR: ./var of this directory
    says_where_it_looked(result, tmp_path / "var")
    assert os.listdir(tmp_path) == []  # not even the state directory


async def test_migrate_creates_the_database_and_commands_elsewhere_find_it(tmp_path: Path) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    created = await cli("migrate", cwd=project)
    assert created.code == 0, created.stderr
    assert "creating a new embedded database in" in created.stderr  # what really happened
    assert "stopped" not in created.stderr.lower()  # a command's own short-lived server: quiet

    lost = await cli("jobs", "list", cwd=elsewhere)
    says_where_it_looked(lost, elsewhere / "var")
    assert os.listdir(elsewhere) == []
    found = await cli(
        "jobs", "list", cwd=elsewhere, env={"DISPATCHER_STATE_DIR": str(project / "var")}
    )
    assert found.code == 0 and found.stdout.startswith("      ID  STATE"), found
    await no_server_left(project / "var" / "pgdata")


async def test_a_database_without_the_schema_is_named_with_its_masked_url(
    tmp_path: Path, empty_db_url: str
) -> None:
    url = empty_db_url.replace("postgres@", "postgres:s3cret-pw@", 1)  # trust auth ignores it
    assert "s3cret-pw" in url
    result = await cli("status", cwd=tmp_path, env={"DISPATCHER_DATABASE_URL": url})
    assert result.code == 1, result
    line = result.stderr.strip()
    assert line.startswith(f"dispatcher: the database at {mask_url(url)}: no dispatcher schema")
    assert "dispatcher migrate" in line and "s3cret-pw" not in line, line


async def test_db_url_reaches_the_daemons_database_with_psql_while_it_runs(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    async with daemon_on(state) as daemon:
        result = await run_cli(state, "db-url")
        assert result.code == 0, result.stderr
        url = result.stdout.strip()
        assert url.startswith("postgresql://") and len(result.stdout.splitlines()) == 1
        conn = await asyncpg.connect(url)  # the URL for libraries
        try:
            assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0
        finally:
            await conn.close()
        # the psql command it prints on stderr, run as printed
        advice = [x for x in result.stderr.splitlines() if x.startswith("connect with: ")]
        assert len(advice) == 1, result.stderr
        psql = shlex.split(advice[0].removeprefix("connect with: "))
        proc = await asyncio.create_subprocess_exec(
            *psql, "-XAtc", "SELECT version()", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0 and out.startswith(b"PostgreSQL 18"), out
        assert await daemon.is_ready()  # nothing was taken from the daemon
        await terminate(daemon)

    stopped = await run_cli(state, "db-url")
    assert (stopped.code, stopped.stdout.strip()) == (1, url)  # same URL, and why it fails now
    assert "is not running" in stopped.stderr and "dispatcher run" in stopped.stderr
    await no_server_left(state / "pgdata")
