"""A real PgBouncer (the Debian package's binary) as a subprocess on a free loopback port, in
front of the test server: what a daemon meets behind a transaction pooler (docs/pooling.md)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.harness import free_port, wait_until


def binary() -> str | None:
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


@contextlib.asynccontextmanager
async def pgbouncer(
    server_url: str,
    database: str,
    *,
    mode: str = "transaction",
    pool_size: int = 20,
    ignore: str = "extra_float_digits",
) -> AsyncIterator[str]:
    """PgBouncer in `mode` (pool_mode) for `database` on the server of `server_url`; yields
    the URL of `database` through it. Skips the test when PgBouncer is not installed."""
    program = binary()
    if program is None:
        pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    server = urlsplit(server_url)
    if not server.hostname:
        # the embedded server listens on a private Unix socket only (mode 0700), which
        # PgBouncer, running as another user, cannot reach; .ci/run runs these tests again on
        # the external server
        pytest.skip("PgBouncer needs a server on TCP: set DATABASE_URL (the embedded one has none)")
    user = server.username or "postgres"
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{database} = host={server.hostname} port={server.port or 5432} dbname={database}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
        # what asyncpg sends at start that PgBouncer does not track itself
        f"ignore_startup_parameters = {ignore}\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
    )
    os.chmod(folder, 0o755)
    for name in ("users.txt", "pgbouncer.ini"):
        os.chmod(folder / name, 0o644)
    argv = [program, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        argv[1:1] = ["-u", "nobody"]
        os.chown(folder, 65534, 65534)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    url = f"postgresql://{user}@127.0.0.1:{port}/{database}"

    async def answers() -> bool:
        if proc.returncode is not None:
            log = folder / "pgbouncer.log"
            raise AssertionError(
                f"pgbouncer exited: {log.read_text()[-2000:] if log.exists() else ''}"
            )
        try:
            conn = await asyncpg.connect(url, statement_cache_size=0, timeout=2)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        await conn.close()
        return True

    try:
        await wait_until(answers, timeout_s=20, interval_s=0.05, what="pgbouncer accepting")
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
