"""The package as a user gets it: the sdist and wheel built from this tree pass `twine check`,
carry the LICENSE, the metadata and the shipped files, and installed into a fresh virtualenv
outside the tree they run the tutorial (docs/tutorial.md) exactly as written: the published name
swapped for the wheel's path and the fixed ports for free ones. About a minute: the build, one
virtualenv and its dependencies from the package index, one daemon start on a new embedded
database."""

from __future__ import annotations

import asyncio
import email
import os
import shutil
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher import __version__
from tests.docs_blocks import ROOT, run_walkthrough
from tests.harness import free_port, no_server_left

pytestmark = pytest.mark.timeout(600)
# The tutorial's `pip install` asks the package index for each dependency: a request the index
# leaves hanging is retried after this many seconds rather than the machine's default (CI once
# spent its whole 240 s on one), and the walk-through has room for a few such retries.
PIP_STALL_S = "20"
TUTORIAL_TIMEOUT_S = 480

SHIPPED = [
    "dispatcher/share/config/dispatcher.toml",
    "dispatcher/share/config/examples/session-cleanup.toml",
    "dispatcher/share/config/prometheus/dispatcher-rules.yml",
    "dispatcher/share/config/grafana/dispatcher-dashboard.json",
    "dispatcher/share/config/sidecar/kubernetes.yaml",
    "dispatcher/share/systemd/dispatcher.service",
    "dispatcher/db/migrations/001_jobs.sql",
    "dispatcher/db/functions/10_enqueue.sql",
    "dispatcher/py.typed",
]
TEST_TOOLS = ("pytest", "hypothesis", "ruff", "mypy", "selenium", "schemathesis", "mkdocs")


async def run(*args: str, cwd: Path, timeout_s: float = 240) -> str:
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{out.decode()}"
    return out.decode()


async def clean_copy(dest: Path) -> Path:
    """The tree as a fresh clone has it (tracked and new files; nothing ignored: a build's
    leftover *.egg-info/SOURCES.txt would add files the manifest forgot)."""
    listed = await run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                       cwd=ROOT)  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def dist(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Path]:
    out = tmp_path_factory.mktemp("dist")
    tree = await clean_copy(tmp_path_factory.mktemp("tree"))
    await run(sys.executable, "-m", "build", "--outdir", str(out), str(tree), cwd=out)
    await run(sys.executable, "-m", "twine", "check", "--strict", *map(str, out.iterdir()), cwd=out)
    yield out


def wheel_of(dist: Path) -> Path:
    [wheel] = dist.glob("pg_dispatcher-*.whl")
    return wheel


async def test_the_wheel_carries_its_metadata_license_and_shipped_files(dist: Path) -> None:
    wheel = wheel_of(dist)
    assert wheel.name == f"pg_dispatcher-{__version__}-py3-none-any.whl"
    assert (dist / f"pg_dispatcher-{__version__}.tar.gz").is_file()
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"pg_dispatcher-{__version__}.dist-info"
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        shipped = archive.read("dispatcher/share/config/dispatcher.toml")
    assert shipped == (ROOT / "config/dispatcher.toml").read_bytes()
    for name in [*SHIPPED, f"{info}/licenses/LICENSE"]:
        assert name in names, name
    assert not any(n.startswith(("tests/", "tools/", "docs/")) for n in names)
    assert metadata["Name"] == "pg-dispatcher"
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Version"] == __version__
    urls = metadata.get_all("Project-URL") or []
    assert {u.split(",")[0] for u in urls} >= {"Homepage", "Documentation", "Source", "Changelog"}
    # a user's install brings no test tools: they come only with an extra
    for requirement in metadata.get_all("Requires-Dist") or []:
        if requirement.lower().startswith(TEST_TOOLS):
            assert "extra ==" in requirement, requirement


async def test_a_wheel_built_straight_from_the_tree_ships_the_same_files(tmp_path: Path) -> None:
    """The container's `pip install .` builds from the tree, not from the sdist: there the
    shipped files come only through MANIFEST.in (`graft config`, `graft systemd`)."""
    tree = await clean_copy(tmp_path / "tree")
    await run(sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(tree),
              cwd=tmp_path)  # fmt: skip
    with zipfile.ZipFile(wheel_of(tmp_path)) as archive:
        names = set(archive.namelist())
    assert [name for name in SHIPPED if name not in names] == []


async def test_the_tutorial_runs_from_the_wheel_in_a_fresh_virtualenv(
    dist: Path, tmp_path: Path
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    api, target = free_port(), free_port()
    inherited = ("PATH", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE")
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in inherited}
    # this tree's virtualenv is not on PATH: the commands are the wheel's
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not p.startswith(str(ROOT)))
    env |= {"HOME": str(home), "DISPATCHER_LISTEN": f"127.0.0.1:{api}"}
    env["PIP_DEFAULT_TIMEOUT"] = PIP_STALL_S
    replace = {
        # not quiet: a timeout's output then shows which download stalled
        "pip install -q pg-dispatcher": f"pip install {wheel_of(dist)}",
        "localhost:8080": f"localhost:{api}",
        "8080/console/": f"{api}/console/",
        "9000": str(target),
        "# dispatcher 0.1.0": f"# dispatcher {__version__}",
    }
    await run_walkthrough("docs/tutorial.md", work, env, replace, TUTORIAL_TIMEOUT_S)
    await no_server_left(work / "var" / "pgdata")
    # the installed package runs from its virtualenv, not from this tree, and prints what it ships
    venv = home / "dispatcher-tutorial" / "bin"
    where = await run(str(venv / "python"), "-c", "import dispatcher; print(dispatcher.__file__)",
                      cwd=work)  # fmt: skip
    assert where.strip().startswith(str(home)), where
    printed = await run(str(venv / "dispatcher"), "config", "example", cwd=work)
    assert printed == (ROOT / "config/dispatcher.toml").read_text()
