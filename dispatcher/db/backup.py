"""`dispatcher backup` and `dispatcher restore`: the dispatcher schema (jobs with their
idempotency keys and attempts, cron run receipts, schedule state) through PostgreSQL's own
pg_dump and pg_restore, the ones shipped with the embedded server.

A backup is one pg_dump snapshot, so it is consistent while a daemon keeps working; it is
written beside FILE and renamed into place, so FILE is never a half-written archive. A restore
reads the archive first (a file pg_restore cannot list changes nothing), refuses a database
that already has a dispatcher schema unless forced, refuses while a daemon is connected, and
runs in one transaction holding the migration lock: it lands whole or not at all, and a daemon
started meanwhile waits for it, saying so (docs/recovery.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import asyncpg

from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query
from dispatcher.db.schema import MIGRATION_LOCK, RESTORE_APPLICATION
from dispatcher.errors import DispatcherError

SCHEMA = "dispatcher"
TIMEOUT_S = 3600.0


class BackupError(DispatcherError):
    """A backup or restore could not be made; the message names the fix."""


@dataclass(frozen=True)
class Contents:
    jobs: int
    runs: int


class BackupRepository:
    """The few reads a backup or a restore decides on."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    @translate_unavailable
    async def schema_exists(self) -> bool:
        return bool(await self.pool.fetchval(query("dispatcher_schema_exists")))

    @translate_unavailable
    async def contents(self) -> Contents:
        row = await self.pool.fetchrow(query("backup_contents"))
        return Contents(jobs=row["jobs"], runs=row["runs"])

    @translate_unavailable
    async def server_version(self) -> int:
        return int(await self.pool.fetchval(query("server_version_num")))

    @translate_unavailable
    async def daemon_sessions(self) -> int:
        return int(await self.pool.fetchval(query("daemon_sessions")))


def client_env(dsn: str) -> tuple[str, dict[str, str]]:
    """The DSN without its password, and an environment carrying it (argv is public in ps)."""
    parts = urlsplit(dsn)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if parts.password is None:
        return dsn, env
    env["PGPASSWORD"] = unquote(parts.password)
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc[1]}")), env


def _failure(program: str, stderr: bytes) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return f"{program} failed: " + (" | ".join(lines[-5:]) or "no message")


def dump(dsn: str, file: Path, bin_dir: Path) -> int:
    """Write the dispatcher schema to `file` (pg_dump's custom format); returns its size."""
    dsn, env = client_env(dsn)
    file = file.absolute()
    fd, partial = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".partial", dir=file.parent)
    os.close(fd)
    try:
        command = [str(bin_dir / "pg_dump"), "--format=custom", f"--schema={SCHEMA}"]
        command += [f"--file={partial}", f"--dbname={dsn}"]
        result = subprocess.run(
            command, env=env, capture_output=True, timeout=TIMEOUT_S, umask=0o077, check=False
        )
        if result.returncode != 0:
            raise BackupError(_failure("pg_dump", result.stderr))
        os.replace(partial, file)
    finally:
        Path(partial).unlink(missing_ok=True)
    return file.stat().st_size


def check_archive(file: Path, bin_dir: Path) -> None:
    """Refuse, before touching the database, a file that is not a dispatcher backup."""
    if not file.is_file():
        raise BackupError(f"{file}: no such file; name a file written by dispatcher backup")
    result = subprocess.run(
        [str(bin_dir / "pg_restore"), "--list", str(file)],
        capture_output=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise BackupError(
            f"{file} is not a backup written by dispatcher backup ("
            + _failure("pg_restore", result.stderr)
            + ")"
        )
    if f" SCHEMA - {SCHEMA} " not in result.stdout.decode(errors="replace"):
        raise BackupError(
            f"{file} holds no dispatcher schema; name a file written by dispatcher backup"
        )


# Settings a newer pg_restore writes that an older server does not know (PostgreSQL 17 added
# transaction_timeout); left out for such a server, whose default is no such timeout anyway.
NEWER_SETTINGS = {170000: b"SET transaction_timeout = 0;\n"}


# An index on an operator class of an extension the schema-only dump does not carry: pg_trgm's
# (migration 039's last-error search), named with the schema the extension had where the
# backup was made.
EXTENSION_INDEX = re.compile(rb"^CREATE INDEX \S+ ON .* ([\w\"]+)\.gin_trgm_ops\b")
# ... restored as migration 039 makes it: pg_trgm created if it may be (in whatever schema it
# ends in), else left out with a notice (the search then scans the newest jobs).
EXTENSION_INDEX_RESTORE = """DO $restore$
DECLARE
    ext name;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pg_trgm') THEN
        BEGIN
            CREATE EXTENSION pg_trgm SCHEMA public;
        EXCEPTION WHEN OTHERS THEN
            RAISE NOTICE 'pg_trgm could not be created (%%): the last-error search scans the '
                         'newest jobs (a superuser may CREATE EXTENSION pg_trgm, then migrate)',
                         SQLERRM;
        END;
    END IF;
    SELECT e.extnamespace::regnamespace::name INTO ext
      FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_trgm';
    IF ext IS NOT NULL THEN
        EXECUTE replace($index$%s$index$, $from$%s.gin_trgm_ops$from$,
                        pg_catalog.quote_ident(ext) || '.gin_trgm_ops');
    END IF;
END
$restore$;
"""


def portable(line: bytes) -> bytes:
    """A line of the dump as the restore sends it: an index on pg_trgm's operator class made
    only where the extension is, or can be, installed (a dump of the dispatcher schema does not
    hold the extension itself)."""
    found = EXTENSION_INDEX.match(line)
    if found is None:
        return line
    statement = line.decode().strip().removesuffix(";")
    return (EXTENSION_INDEX_RESTORE % (statement, found.group(1).decode())).encode()


def restore(dsn: str, file: Path, bin_dir: Path, *, server_version: int, replace: bool) -> None:
    """Load `file` in one transaction; with `replace`, the existing schema is dropped first in
    that same transaction. COMMIT is sent only once pg_restore has read the whole archive: a
    damaged archive or an error leaves the database as it was."""
    dsn, env = client_env(dsn)
    env["PGAPPNAME"] = RESTORE_APPLICATION  # how a daemon arriving meanwhile names what it waits on
    unknown = {line for since, line in NEWER_SETTINGS.items() if server_version < since}
    psql = [
        str(bin_dir / "psql"),
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-f",
        "-",
        f"--dbname={dsn}",
    ]
    with tempfile.TemporaryFile() as script_err, tempfile.TemporaryFile() as load_err:
        script = subprocess.Popen(
            [str(bin_dir / "pg_restore"), "--no-owner", "--file=-", str(file)],
            stdout=subprocess.PIPE,
            stderr=script_err,
            env=env,
        )
        load = subprocess.Popen(
            psql, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=load_err, env=env
        )
        assert script.stdout is not None and load.stdin is not None
        try:
            load.stdin.write(b"BEGIN;\n")
            # the migration lock for the whole load: a daemon or a command that starts now waits
            # for it (dispatcher.db.schema) instead of racing CREATE SCHEMA
            load.stdin.write(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK});\n".encode())
            if replace:
                load.stdin.write(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;\n".encode())
            for line in script.stdout:
                if line not in unknown:
                    load.stdin.write(portable(line))
            if script.wait(timeout=TIMEOUT_S) == 0:
                load.stdin.write(b"COMMIT;\n")
        except BrokenPipeError:  # psql stopped at an error: its message says which
            pass
        finally:
            script.stdout.close()
            with contextlib.suppress(BrokenPipeError):
                load.stdin.close()  # without COMMIT, psql's end rolls everything back
            script.wait(timeout=TIMEOUT_S)
            load.wait(timeout=TIMEOUT_S)
        if script.returncode != 0:
            script_err.seek(0)
            raise BackupError(_failure("pg_restore", script_err.read()) + "; nothing was restored")
        if load.returncode != 0:
            load_err.seek(0)
            raise BackupError(_failure("psql", load_err.read()) + "; nothing was restored")
