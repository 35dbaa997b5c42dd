"""The embedded PostgreSQL over months of real use: one owner per state directory and no orphaned
server, whatever killed whom; a data directory of another major is never started; backups made
while the daemon runs restore whole. Real `dispatcher` processes, real signals, real servers."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.harness import (
    DaemonProcess,
    Result,
    daemon_on,
    env_for,
    get,
    no_server_left,
    post,
    postmasters,
    run_cli,
    terminate,
)
from tests.harness.fixtures import Spawn

pytestmark = pytest.mark.timeout(300)

JOB = {
    "handler": "http",
    "target": {"url": "https://hooks.example.com/grants"},
    "payload": {"grant": 17},
    "due_at": "2031-05-31T02:00:00Z",  # far ahead: nothing runs, the intent just waits
}
SCHEDULE = """
[handlers.record]
kind = "python"
function = "tests.faults.handlers:record_effect"

[[schedules]]
name = "nightly"
cron = "0 3 * * *"
handler = "record"
"""
PERIOD = "2026-05-30T03:00:00+00:00"


def quiet_about_the_server(result: Result) -> None:
    """A command neither starts nor stops anything as far as its output is concerned."""
    text = (result.stdout + result.stderr).lower()
    assert "embedded postgresql" not in text, text
    assert "stopped" not in text and "starting" not in text, text


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


async def kill_hard(daemon: DaemonProcess, data_dir: Path) -> list[int]:
    """kill -9 the daemon; its server lives on (that is what a crash leaves behind)."""
    daemon.signal(signal.SIGKILL)
    await daemon.wait(timeout_s=30)
    left = postmasters(data_dir)
    assert left, "the embedded server should outlive a kill -9 of its owner"
    return left


async def test_kill9_restart_sigterm_leaves_no_server(state: Path) -> None:
    data = state / "pgdata"
    async with daemon_on(state) as first:
        status, job = await post(first, "orphan-1", JOB)
        assert status == 202, job
        orphan = await kill_hard(first, data)

    async with daemon_on(state) as second:
        assert postmasters(data) == orphan  # the orphan was adopted, not duplicated
        status, view = await get(second, f"/v1/jobs/{job['id']}")
        assert (status, view["state"]) == (200, "scheduled")
        await terminate(second)
    await no_server_left(data)


async def test_kill9_command_restart_sigterm_leaves_no_server(state: Path) -> None:
    data = state / "pgdata"
    async with daemon_on(state) as first:
        await kill_hard(first, data)

    # a command finds no daemon: it owns the server for its own short life, then stops it
    result = await run_cli(state, "status", "--json")
    assert result.code == 0, result.stderr
    quiet_about_the_server(result)
    await no_server_left(data)

    async with daemon_on(state) as second:
        await terminate(second)
    await no_server_left(data)


async def test_a_command_never_stops_the_daemons_server(state: Path) -> None:
    data = state / "pgdata"
    async with daemon_on(state) as daemon:
        server = postmasters(data)
        for args in (("status",), ("jobs", "list"), ("migrate",), ("schedules",)):
            result = await run_cli(state, *args)
            assert result.code == 0, (args, result.stderr)
            quiet_about_the_server(result)
            assert postmasters(data) == server
            assert await daemon.is_ready()
        status, job = await post(daemon, "after-commands", JOB)
        assert status == 202, job
        await terminate(daemon)
    await no_server_left(data)


async def test_a_second_daemon_on_the_same_state_directory_is_refused(
    state: Path, spawn: Spawn
) -> None:
    async with daemon_on(state) as first:
        second = await spawn(
            env_for(state, DISPATCHER_LOG_FORMAT="text"),
            wait_ready=False,
            unset=("DISPATCHER_DATABASE_URL",),
        )
        code = await second.wait(timeout_s=60)
        lines = [line for line in second.log_text().splitlines() if "already runs" in line]
        assert code == 1, second.log_text()
        assert len(lines) == 1, second.log_text()
        assert f"pid {first.proc.pid}" in lines[0] and "DISPATCHER_DATABASE_URL" in lines[0]  # type: ignore[union-attr]
        assert "Traceback" not in second.log_text()
        assert await first.is_ready()
        await terminate(first)
    await no_server_left(state / "pgdata")


# not root -------------------------------------------------------------------------------------
def reachable(path: Path) -> bool:
    """Whether another user can reach `path` (every directory above it has the search bit)."""
    return all(d.stat().st_mode & stat.S_IXOTH for d in path.parents)


def as_nobody() -> list[str]:
    """A command prefix running Python as `nobody` with this checkout and its packages, or a
    skip saying why that cannot be done here."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user (run as non-root, every test is this case)")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [f"/usr/bin/{version}", f"/usr/local/bin/{version}", shutil.which(version) or "/"]
    pythons = [p for p in found if os.access(p, os.X_OK) and reachable(Path(p))]
    paths = [str(Path(__file__).parents[2]), sysconfig.get_paths()["purelib"]]
    if not pythons or not all(reachable(Path(p)) for p in paths):
        pytest.skip(f"no {version} and packages that other users can reach")
    return [
        *("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"),
        *("env", f"PYTHONPATH={os.pathsep.join(paths)}", pythons[0], "-m", "dispatcher.cli"),
    ]


async def test_a_non_root_user_runs_its_own_server_in_a_private_directory() -> None:
    prefix = as_nobody()
    home = Path(tempfile.mkdtemp(prefix="dispatcher-nonroot-"))
    try:
        os.chmod(home, 0o755)
        os.chown(home, pwd.getpwnam("nobody").pw_uid, -1)
        state = home / "state"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
        env["DISPATCHER_STATE_DIR"] = str(state)
        proc = await asyncio.create_subprocess_exec(
            *prefix, "migrate", cwd=home, env=env, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        data = (state / "pgdata").stat()
        assert (data.st_uid, stat.S_IMODE(data.st_mode)) == (pwd.getpwnam("nobody").pw_uid, 0o700)
        await no_server_left(state / "pgdata")

        # root does not take over another user's database: one line naming the fix
        result = await run_cli(state, "migrate")
        assert result.code == 1 and "belongs to uid" in result.stderr, result.stderr
        assert (state / "pgdata").stat().st_uid == data.st_uid
    finally:
        shutil.rmtree(home, ignore_errors=True)


# major-version guard ------------------------------------------------------------------------
def postgres16_bin() -> Path:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs PostgreSQL 16 binaries: pip install pgserver (the test extra)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


async def test_a_data_directory_of_another_major_is_refused_then_upgraded(
    state: Path, spawn: Spawn
) -> None:
    old_bin = postgres16_bin()
    data = state / "pgdata"
    async with daemon_on(state, DISPATCHER_EMBEDDED_POSTGRES_BIN=str(old_bin)) as old:
        status, job = await post(old, "from-16", JOB)
        assert status == 202, job
        await terminate(old)
    assert (data / "PG_VERSION").read_text().strip() == "16"

    # the current release refuses it, in one line naming the majors and the commands
    refused = await spawn(
        env_for(state, DISPATCHER_LOG_FORMAT="text"),
        wait_ready=False,
        unset=("DISPATCHER_DATABASE_URL",),
    )
    assert await refused.wait(timeout_s=60) == 1
    lines = [x for x in refused.log_text().splitlines() if "holds a PostgreSQL 16" in x]
    assert len(lines) == 1, refused.log_text()
    for words in ("PostgreSQL 18.", "dispatcher backup", "dispatcher restore", "pg_upgrade"):
        assert words in lines[0], lines[0]
    assert not postmasters(data) and (data / "PG_VERSION").read_text().strip() == "16"

    # the upgrade the line names: back up with 16's binaries, move aside, restore with 18
    dump = state.parent / "upgrade.dump"
    result = await run_cli(
        state, "backup", str(dump), DISPATCHER_EMBEDDED_POSTGRES_BIN=str(old_bin)
    )
    assert result.code == 0, result.stderr
    data.rename(state / "pgdata-16")
    result = await run_cli(state, "restore", str(dump))
    assert result.code == 0, result.stderr
    assert (data / "PG_VERSION").read_text().strip() == "18"
    async with daemon_on(state) as new:
        status, replay = await post(new, "from-16", JOB)
        assert (status, replay["id"]) == (202, job["id"])
        await terminate(new)
    await no_server_left(data)


# backup and restore --------------------------------------------------------------------------
async def test_backup_while_running_then_restore_elsewhere(tmp_path: Path) -> None:
    config = tmp_path / "dispatcher.toml"
    config.write_text(SCHEDULE)
    first, second = tmp_path / "first", tmp_path / "second"
    dump = tmp_path / "jobs.dump"
    async with daemon_on(first, DISPATCHER_CONFIG=str(config)) as daemon:
        status, job = await post(daemon, "kept-1", JOB)
        assert status == 202, job
        status, receipt = await trigger(daemon)
        assert (status, receipt["outcome"]) == (202, "created"), receipt
        result = await run_cli(first, "backup", str(dump))
        assert result.code == 0, result.stderr
        assert oct(dump.stat().st_mode & 0o777) == "0o600"
        # never under a running daemon, even when forced
        result = await run_cli(first, "restore", str(dump), "--force")
        assert result.code == 1 and "stop every dispatcher run" in result.stderr
        status, later = await post(daemon, "after-backup", JOB)  # not in the backup
        assert status == 202, later
        await terminate(daemon)

    result = await run_cli(second, "restore", str(dump))
    assert result.code == 0, result.stderr
    assert "jobs, 1 run receipts" in result.stdout, result.stdout
    refused = await run_cli(second, "restore", str(dump))
    assert refused.code == 1 and "--force" in refused.stderr
    forced = await run_cli(second, "restore", str(dump), "--force")
    assert forced.code == 0, forced.stderr

    async with daemon_on(second, DISPATCHER_CONFIG=str(config)) as daemon:
        status, view = await get(daemon, f"/v1/jobs/{job['id']}")
        assert (status, view["key"], view["state"]) == (200, "kept-1", "scheduled")
        status, replay = await post(daemon, "kept-1", JOB)  # idempotency key restored
        assert (status, replay["id"]) == (202, job["id"])
        status, conflict = await post(daemon, "kept-1", {**JOB, "payload": {"grant": 18}})
        assert status == 409, conflict
        status, again = await trigger(daemon)  # the run receipt restored: not created twice
        assert status == 200 and again["run_key"] == receipt["run_key"], again
        assert again["outcome"] != "created"
        status, missing = await get(daemon, f"/v1/jobs/{later['id']}")
        assert status == 404, missing
        await terminate(daemon)


async def trigger(daemon: DaemonProcess) -> tuple[int, dict[str, object]]:
    import aiohttp

    url = f"{daemon.base_url}/v1/schedules/nightly/trigger"
    async with aiohttp.ClientSession() as s, s.post(url, json={"period_start": PERIOD}) as r:
        return r.status, await r.json(content_type=None)


async def test_restore_refuses_what_is_not_a_backup(tmp_path: Path) -> None:
    state = tmp_path / "state"
    junk = tmp_path / "junk.dump"
    junk.write_text("not an archive")
    result = await run_cli(state, "restore", str(junk))
    assert result.code == 1 and "not a backup written by dispatcher backup" in result.stderr
    assert not (state / "pgdata").exists()  # nothing was created, let alone changed
    result = await run_cli(state, "restore", str(tmp_path / "absent.dump"))
    assert result.code == 1 and "no such file" in result.stderr
