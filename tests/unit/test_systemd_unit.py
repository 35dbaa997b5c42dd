"""The systemd unit: its promises about start, stop and secrets, and what systemd makes of it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from dispatcher.config.settings import Settings

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "dispatcher.service"
INSTALLED_BINARY = "/usr/local/bin/dispatcher"
MAX_EXPOSURE = 2.0
STOP_MARGIN_S = 10  # after the drain: stop the embedded PostgreSQL, flush logs

needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is absent: apt-get install systemd",
)


def directives(section: str) -> list[tuple[str, str]]:
    """(key, value) pairs of one section, in order; keys may repeat, as systemd allows."""
    pairs: list[tuple[str, str]] = []
    current = None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section:
            key, _, value = line.partition("=")
            pairs.append((key.strip(), value.strip()))
    return pairs


def values(section: str, key: str) -> list[str]:
    return [value for name, value in directives(section) if name == key]


def only(section: str, key: str) -> str:
    found = values(section, key)
    assert len(found) == 1, f"{key}= must appear once in [{section}], found {found}"
    return found[0]


def environment() -> dict[str, str]:
    pairs = (value.partition("=") for value in values("Service", "Environment"))
    return {name: value for name, _, value in pairs}


def test_readiness_and_watchdog_come_from_the_daemon() -> None:
    assert only("Service", "Type") == "notify"
    assert only("Service", "NotifyAccess") == "main"
    assert int(only("Service", "WatchdogSec")) > 0
    assert only("Service", "ExecStart").startswith(f"{INSTALLED_BINARY} run ")


def test_stop_timeout_outlasts_the_default_drain() -> None:
    assert int(only("Service", "TimeoutStopSec")) >= Settings().stop_budget_s() + STOP_MARGIN_S
    assert only("Service", "KillSignal") == "SIGTERM"
    # SIGTERM to the daemon only: the embedded PostgreSQL must outlive the drain.
    assert only("Service", "KillMode") == "mixed"


def test_restarts_are_bounded() -> None:
    assert only("Service", "Restart") == "on-failure"
    assert int(only("Service", "RestartSec")) > 0
    assert int(only("Unit", "StartLimitBurst")) > 0
    assert int(only("Unit", "StartLimitIntervalSec")) > 0


def test_state_and_secrets_reach_the_daemon_through_systemd() -> None:
    env = environment()
    assert only("Service", "StateDirectory") == "dispatcher"
    assert env["DISPATCHER_STATE_DIR"] == "%S/dispatcher"
    credentials = {value.partition(":")[0] for value in values("Service", "LoadCredential")}
    for variable in ("DISPATCHER_API_TOKENS_FILE", "DISPATCHER_HTTP__SIGNING_SECRET_FILE"):
        directory, _, name = env[variable].partition("/")
        assert directory == "%d", f"{variable} must name a file in the credentials directory"
        assert name in credentials, f"{variable} names {name!r}, which no LoadCredential= loads"


def test_runs_unprivileged() -> None:
    assert only("Service", "DynamicUser") == "yes"
    assert only("Service", "CapabilityBoundingSet") == ""
    assert only("Service", "NoNewPrivileges") == "yes"
    assert only("Service", "ProtectSystem") == "strict"


@pytest.fixture
def checkable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's console script.

    `systemd-analyze verify` insists that the binary exists; the shipped unit names the path a
    system-wide `pip install` gives, which a test environment need not have.
    """
    script = Path(sysconfig.get_path("scripts")) / "dispatcher"
    assert script.exists(), f"{script} is missing: install the package (pip install -e .)"
    text = UNIT.read_text()
    assert INSTALLED_BINARY in text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(f"ExecStart={INSTALLED_BINARY} ", f"ExecStart={script} "))
    return copy


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_unit(checkable_unit: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(checkable_unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    complaints = [line for line in output.splitlines() if UNIT.name in line]
    assert complaints == []


@needs_systemd_analyze
def test_security_exposure_stays_low(checkable_unit: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(checkable_unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "--offline" in result.stderr and result.returncode != 0:
        pytest.skip("this systemd-analyze cannot score a unit file (--offline needs systemd 250)")
    assert result.returncode == 0, result.stderr
    match = re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout)
    assert match is not None, result.stdout
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout
