"""A full disk under the database, on a real size-limited filesystem (tmpfs, mounted as root):

- the embedded database's state directory fills past its reserve: the daemon turns unready with
  the reason, the metric says so, intake answers 503 with Retry-After; work already accepted is
  kept; once space returns everything is accepted and delivered, nothing lost;
- PostgreSQL itself refuses a write for a full disk (SQLSTATE 53100): the repository answers
  `DatabaseUnavailable` (the API's 503), and the same write succeeds once space is freed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import create_pool
from dispatcher.errors import DatabaseUnavailable
from dispatcher.model import NewJob
from tests.harness import (
    LOOPBACK_ENV,
    Target,
    daemon_on,
    get,
    no_server_left,
    post,
    serve_target,
    terminate,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)
MB = 1024 * 1024


@contextlib.contextmanager
def small_filesystem(size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb`, reachable by the server's user; skips (saying why) where mounting
    is refused."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="dispatcher-disk-"))
    where.chmod(0o755)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def fill(directory: Path, leave_bytes: int) -> Path:
    """A file that takes all free space under `directory` but `leave_bytes`."""
    filler = directory / f"filler-{uuid.uuid4().hex[:6]}"
    stats = os.statvfs(directory)
    size = stats.f_bavail * stats.f_frsize - leave_bytes
    chunk = b"\0" * MB
    with filler.open("wb") as out:
        while size > 0:
            try:
                out.write(chunk[: min(size, MB)])
                out.flush()
            except OSError:  # ENOSPC: as full as it gets
                break
            size -= MB
    return filler


def job(target: Target, **fields: Any) -> dict[str, Any]:
    return {"handler": "http", "target": {"url": target.url}, "payload": {}, **fields}


async def metric(daemon: Any, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{daemon.base_url}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


async def test_a_full_state_directory_is_reported_refused_and_recovered() -> None:
    reserve_mb = 16
    with small_filesystem(128) as disk:
        state = disk / "state"
        env = {
            "DISPATCHER_STATE_DIR_MIN_FREE_MB": str(reserve_mb),
            **LOOPBACK_ENV,
        }
        async with serve_target(Target()) as target, daemon_on(state, **env) as daemon:
            status, before = await post(daemon, "before", job(target))
            assert status == 202, before
            status, later = await post(daemon, "later", job(target, due_at="2031-01-01T00:00:00Z"))
            assert status == 202, later
            assert await metric(daemon, "dispatcher_state_dir_low_space") == 0

            filler = fill(disk, leave_bytes=reserve_mb * MB // 2)

            async def reported() -> bool:
                status, body = await get(daemon, "/readyz")
                return status == 503 and body["reason"].startswith("disk full")

            await wait_until(reported, timeout_s=30, what="/readyz to report the full disk")
            assert await metric(daemon, "dispatcher_state_dir_low_space") == 1
            assert await metric(daemon, "dispatcher_state_dir_free_bytes") < reserve_mb * MB
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    f"{daemon.base_url}/v1/jobs",
                    json=job(target),
                    headers={"Idempotency-Key": "during"},
                ) as r,
            ):
                assert r.status == 503, await r.text()
                assert r.headers["Content-Type"].startswith("application/problem+json")
                assert "Retry-After" in r.headers
            assert (await get(daemon, "/healthz"))[0] == 200  # alive: no restart wanted

            filler.unlink()  # space returns

            async def ready() -> bool:
                return (await get(daemon, "/readyz"))[0] == 200

            await wait_until(ready, timeout_s=30, what="/readyz after space returned")
            status, during = await post(daemon, "during", job(target))  # the client's retry
            assert status == 202, during

            await target.wait_for(
                lambda t: {"before", "during"} <= set(t.request_keys()),
                timeout_s=60,
                what="both jobs delivered",
            )
            for accepted, state_now in ((before, "succeeded"), (later, "scheduled")):
                status, view = await get(daemon, f"/v1/jobs/{accepted['id']}")
                assert (status, view["state"]) == (200, state_now), view
            assert await metric(daemon, "dispatcher_state_dir_low_space") == 0
            await terminate(daemon)
        await no_server_left(state / "pgdata")


def owned_like(data_dir: Path, location: Path) -> Path:
    """`location`, created for the OS user that owns the server's data directory."""
    if not data_dir.exists():
        pytest.skip("the server's data directory is not on this machine")
    owner = data_dir.stat()
    location.mkdir()
    os.chown(location, owner.st_uid, owner.st_gid)
    return location


@contextlib.asynccontextmanager
async def full_tablespace(admin: asyncpg.Connection, disk: Path) -> AsyncIterator[str]:
    """A tablespace on `disk`, owned by whichever OS user runs the server."""
    location = owned_like(Path(await admin.fetchval("SHOW data_directory")), disk / "ts")
    name = f"full_{uuid.uuid4().hex[:8]}"
    await admin.execute(f"CREATE TABLESPACE {name} LOCATION '{location}'")
    try:
        yield name
    finally:
        with contextlib.suppress(asyncpg.PostgresError):
            await admin.execute(f"DROP TABLESPACE {name}")


JOB_TABLES = ("dispatcher.intents", "dispatcher.job_state")


async def test_postgres_disk_full_is_unavailable_then_recovers(db_url: str) -> None:
    """The jobs table on a full filesystem: SQLSTATE 53100 leaves the repository as
    `DatabaseUnavailable` (503), nothing is half-written, and the same write succeeds once
    there is room."""
    items = [new_job(f"k{i}") for i in range(40)]
    with small_filesystem(8) as disk:
        admin = await asyncpg.connect(db_url)
        pool = await create_pool(db_url, size=2)
        try:
            async with full_tablespace(admin, disk) as tablespace:
                for table in JOB_TABLES:  # dispatcher.jobs is a view over these (migration 015)
                    await admin.execute(f"ALTER TABLE {table} SET TABLESPACE {tablespace}")
                try:
                    filler = fill(disk, leave_bytes=0)
                    repo = JobRepository(pool)
                    with pytest.raises(DatabaseUnavailable, match="DiskFullError"):
                        await repo.enqueue_many(items)
                    assert await admin.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0
                    filler.unlink()
                    stored = await repo.enqueue_many(items)
                    assert [r.outcome for r in stored] == ["created"] * len(items)
                finally:  # the tablespace must be empty to go
                    for table in JOB_TABLES:
                        await admin.execute(f"ALTER TABLE {table} SET TABLESPACE pg_default")
        finally:
            await pool.close()
            await admin.close()


def new_job(key: str) -> NewJob:
    # random bytes: a compressible payload would fit in the pages there are
    return NewJob(
        key=key,
        handler="http",
        payload={"pad": os.urandom(8000).hex()},
        target={"url": "https://hooks.example.com/x"},
        due_at=datetime(2031, 1, 1, tzinfo=UTC),
    )
