"""docs/first-hour.md's systemd recipe for Debian 12 with a virtualenv: what can be checked
without booting a Debian host. No system-wide pip (Debian 12 refuses it: PEP 668); the venv's
command is linked to the unit's ExecStart path; a venv console script runs through such a link;
and systemd-analyze accepts the unit with ExecStart at the link."""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "first-hour.md"
UNIT = ROOT / "systemd" / "dispatcher.service"


def recipe() -> list[str]:
    """The shell lines of the page's systemd section."""
    section = PAGE.read_text().split("## systemd on Debian 12", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the systemd section has no sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def exec_start_binary() -> str:
    match = re.search(r"^ExecStart=(\S+)", UNIT.read_text(), re.M)
    assert match is not None
    return match.group(1)


def test_the_recipe_installs_into_a_venv_and_links_the_units_binary() -> None:
    lines = recipe()
    assert not [line for line in lines if re.search(r"sudo (python3 -m )?pip ", line)]
    venv = next(line.split()[-1] for line in lines if "-m venv" in line)
    links = [line.split()[-2:] for line in lines if line.startswith("sudo ln -sf ")]
    assert links == [[f"{venv}/bin/dispatcher", exec_start_binary()]]
    assert any(line.startswith(f"sudo {venv}/bin/pip install") for line in lines)


@pytest.mark.skipif(
    not list(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED")),
    reason="this system's Python is not externally managed (not Debian 12 or later)",
)
def test_a_system_wide_pip_install_is_refused_here() -> None:
    """Why the recipe uses a venv: on this Debian the old recipe's first line fails."""
    result = subprocess.run(
        ["/usr/bin/python3", "-m", "pip", "install", "--dry-run", "--no-index", "dispatcher"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "No module named pip" in result.stderr:
        pytest.skip("the system Python has no pip")
    assert result.returncode != 0 and "externally-managed-environment" in result.stderr


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """/usr/local/bin/dispatcher as the recipe makes it: a link to a venv's console script
    (this test environment's own venv stands in for /opt/dispatcher)."""
    script = Path(sysconfig.get_path("scripts")) / "dispatcher"
    assert script.exists(), f"{script} is missing: install the package (pip install -e .)"
    link = tmp_path / "usr-local-bin" / "dispatcher"
    link.parent.mkdir()
    link.symlink_to(script)
    return link


def test_a_venv_console_script_runs_through_the_link(linked: Path) -> None:
    result = subprocess.run(
        [str(linked), "--version"], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("dispatcher ")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="apt-get install systemd")
def test_systemd_analyze_verifies_the_unit_run_through_the_link(
    linked: Path, tmp_path: Path
) -> None:
    unit = tmp_path / UNIT.name
    unit.write_text(
        UNIT.read_text().replace(f"ExecStart={exec_start_binary()} ", f"ExecStart={linked} ")
    )
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert [line for line in output.splitlines() if UNIT.name in line] == []
